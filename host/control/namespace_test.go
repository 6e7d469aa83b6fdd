package control

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestStateURL(t *testing.T) {
	id := "pl-0123456789abcdef"
	abs, _ := filepath.Abs(".clink/server")
	for data, want := range map[string]string{
		"file:///var/clink":   "file:///var/clink/state/acme/" + id,
		"file:///var/clink/":  "file:///var/clink/state/acme/" + id,
		".clink/server":       "file://" + abs + "/state/acme/" + id,
		"s3://bucket":         "s3://bucket/state/acme/" + id,
		"s3://bucket/pre/fix": "s3://bucket/pre/fix/state/acme/" + id,
		"s3://b/p?endpoint=http%3A%2F%2F127.0.0.1%3A9000&path_style=true": "s3://b/p/state/acme/" + id + "?endpoint=http%3A%2F%2F127.0.0.1%3A9000&path_style=true",
	} {
		got, err := StateURL(data, "acme", id)
		if err != nil || got != want {
			t.Errorf("StateURL(%q) = %q, %v; want %q", data, got, err, want)
		}
	}
	for _, bad := range [][2]string{{"..", id}, {"acme/x", id}, {"Acme", id}, {"acme", "../x"}, {"acme", "pl-../../etc"}, {"acme", ""}} {
		if got, err := StateURL("file:///d", bad[0], bad[1]); err == nil {
			t.Errorf("StateURL(%q, %q) = %q", bad[0], bad[1], got)
		}
	}
	if _, err := StateURL("mem://", "acme", id); err == nil || !strings.Contains(err.Error(), "scheme") {
		t.Errorf("mem:// accepted: %v", err)
	}
}
