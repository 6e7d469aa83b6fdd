package abi

import (
	"strings"
	"testing"
)

// TestManifestStateVersion: state_version and migrates_from are validated, and Migrates says
// which checkpoints a module may restore.
func TestManifestStateVersion(t *testing.T) {
	for _, tc := range []struct{ json, want string }{
		{`{"abi":1,"name":"x","state_version":-1}`, "state_version -1 is negative"},
		{`{"abi":1,"name":"x","state_version":2,"migrates_from":[2]}`, "its own state_version"},
		{`{"abi":1,"name":"x","state_version":2,"migrates_from":[1,1]}`, "lists 1 twice"},
		{`{"abi":1,"name":"x","state_version":2,"migrates_from":[-3]}`, "a negative version"},
		{`{"abi":1,"name":"x","state_version":"2"}`, "not valid JSON"},
	} {
		if _, err := ParseManifest([]byte(tc.json)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.json, err, tc.want)
		}
	}
	m, err := ParseManifest([]byte(`{"abi":1,"name":"x","state_version":3,"migrates_from":[0,2]}`))
	if err != nil {
		t.Fatal(err)
	}
	for v, want := range map[int]bool{0: true, 1: false, 2: true, 3: true, 4: false} {
		if m.Migrates(v) != want {
			t.Errorf("Migrates(%d) = %v", v, !want)
		}
	}
	if old, err := ParseManifest([]byte(`{"abi":1,"name":"x"}`)); err != nil || old.StateVersion != 0 || !old.Migrates(0) || old.Migrates(1) {
		t.Errorf("unversioned: %+v %v", old, err)
	}
}
