package replay

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzReadLines feeds arbitrary file contents to the reader of each recording file (users may
// hand-edit them). It must never panic, and whatever it accepts must survive a write and a
// read unchanged.
func FuzzReadLines(f *testing.F) {
	for _, s := range []string{
		`{"kind":"record","pos":1,"key":"u1","value":"{\"a\":1}","ts":5}` + "\n" + `{"kind":"watermark","ts":9}`,
		`{"kind":"record","pos":2,"key_by_module":true,"value":{"base64":"/w=="},"ts":0}`,
		`{"op":"get","state":"count","key":"u1","found":true,"value":{"base64":"AQAAAAAAAAA="},"tier":"cold"}` + "\n" + `{"op":"put","state":"count","key":"u1"}`,
		`{"op":"operator_state","name":"timers","found":true,"value":"x"}`,
		`{"endpoint":"svc","request":"POST /enrich\n\n{}","status":200,"body":"{}"}` + "\n" + `{"endpoint":"svc","request":"GET /x","error":"LOOKUP_TIMEOUT"}`,
		`{"src":{"pos":3,"key":"k","ts":1},"key":"k","value":"1","ts":1}`,
		"\n\n{}\n", `{"kind":"record"} {"kind":"record"}`, `{"op":"get","state":"s","found":false,"value":"x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		roundTrip[Element](t, data)
		roundTrip[StateOp](t, data)
		roundTrip[Lookup](t, data)
		roundTrip[Output](t, data)
		_, _ = ParseManifest(data)
	})
}

func roundTrip[T any](t *testing.T, data []byte) {
	var got []T
	if err := readLines("f.jsonl", bytes.NewReader(data), func(_ int64, v *T) error {
		got = append(got, *v)
		return nil
	}); err != nil {
		return
	}
	var buf bytes.Buffer
	for i := range got {
		b, err := json.Marshal(&got[i])
		if err != nil {
			t.Fatalf("accepted %T %+v does not encode: %v", got[i], got[i], err)
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	var again []T
	if err := readLines("f.jsonl", &buf, func(_ int64, v *T) error {
		again = append(again, *v)
		return nil
	}); err != nil {
		t.Fatalf("re-reading what was accepted: %v\n%s", err, buf.String())
	}
	if !reflect.DeepEqual(normalize(got), normalize(again)) {
		t.Fatalf("round trip changed the lines:\n%+v\n%+v", got, again)
	}
}

// normalize compares through JSON (nil and empty byte strings are one value in the format when
// a field is omitted).
func normalize(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// FuzzBytes checks the byte-string encoding: lossless for any bytes, and the standard JSON
// string for valid UTF-8 (what encoding/json writes for a string).
func FuzzBytes(f *testing.F) {
	for _, s := range []string{"", "abc", "\xff\x00", "{\"a\":1}", "\u2028<&>", "\x7f\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		enc, err := json.Marshal(Bytes(b))
		if err != nil {
			t.Fatal(err)
		}
		var back Bytes
		if err := json.Unmarshal(enc, &back); err != nil {
			t.Fatalf("%q: %v", enc, err)
		}
		if !bytes.Equal(back, b) {
			t.Fatalf("%q -> %s -> %q", b, enc, back)
		}
		if utf8.Valid(b) {
			std, _ := json.Marshal(string(b))
			if !bytes.Equal(enc, std) {
				t.Fatalf("%q: %s, encoding/json writes %s", b, enc, std)
			}
		} else if !strings.HasPrefix(string(enc), `{"base64":`) {
			t.Fatalf("%q: %s", b, enc)
		}
	})
}
