package ingest

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzFrame checks the ingest framing against encoding/json: a body is accepted exactly when
// every non-blank line is a JSON object, and then each framed line is one of them, compacted.
func FuzzFrame(f *testing.F) {
	for _, s := range []string{"{\"a\":1}\n{\"b\":[1,2]}\n", "\n\n", "{\"a\":1}\n[1]\n", "{\"a\":\n1}", "{} {}", "{\"a\":\"\\u0000\"}\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		framed, n, err := Frame(body)
		var want [][]byte
		valid := true
		for _, line := range bytes.Split(body, []byte("\n")) {
			line = bytes.TrimSpace(line)
			if len(line) == 0 {
				continue
			}
			var m map[string]any
			if !json.Valid(line) || json.Unmarshal(line, &m) != nil || m == nil {
				valid = false
				break
			}
			var c bytes.Buffer
			json.Compact(&c, line)
			want = append(want, c.Bytes())
		}
		if valid != (err == nil) {
			t.Fatalf("Frame(%q): err %v, stdlib says valid=%v", body, err, valid)
		}
		if err != nil {
			return
		}
		got := bytes.Split(bytes.TrimSuffix(framed, []byte("\n")), []byte("\n"))
		if len(framed) == 0 {
			got = nil
		}
		if n != len(want) || len(got) != len(want) {
			t.Fatalf("Frame(%q): %d records, %d lines, want %d", body, n, len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) || bytes.IndexByte(got[i], '\n') >= 0 {
				t.Fatalf("line %d: %q, want %q", i, got[i], want[i])
			}
		}
	})
}
