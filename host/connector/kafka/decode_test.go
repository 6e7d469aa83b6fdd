package kafka

import (
	"strings"
	"testing"
)

// TestDecodeFields: a record's key and event time come from its JSON fields; a record that
// lacks one, or holds a value that is not a key or a time, gets an Err naming the field, and
// keeps its position (the pipeline decides what to do with it).
func TestDecodeFields(t *testing.T) {
	s := &Source{cfg: SourceConfig{KeyField: "k", TimeField: "ts"}}
	for _, c := range []struct {
		value, key string
		time       int64
		err        string
	}{
		{value: `{"k":"u1","ts":1700000000000}`, key: "u1", time: 1700000000000},
		{value: `{"k":7,"ts":"2023-11-14T22:13:20Z"}`, key: "7", time: 1700000000000},
		{value: `{"ts":1}`, err: `key field "k": no key field "k"`},
		{value: `{"k":"u1"}`, err: `time field "ts": no time field "ts"`},
		{value: `{"k":{"a":1},"ts":1}`, err: `key field "k": `},
		{value: `{"k":"u1","ts":"yesterday"}`, err: `time field "ts": a time must be`},
		{value: `not json`, err: `the value is not JSON`},
	} {
		r := &Record{Value: []byte(c.value)}
		s.decode(r)
		if c.err != "" {
			if r.Err == nil || !strings.HasPrefix(r.Err.Error(), c.err) {
				t.Errorf("%s: err %v, want it to start %q", c.value, r.Err, c.err)
			}
			continue
		}
		if r.Err != nil || string(r.Key) != c.key || r.Time != c.time {
			t.Errorf("%s: key %q time %d err %v, want %q %d", c.value, r.Key, r.Time, r.Err, c.key, c.time)
		}
	}
}
