package jsonfield

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzTop checks Top against encoding/json decoding into a map: for every valid
// JSON object both find the same fields with the same raw values (the last duplicate wins),
// and Top refuses valid JSON that is not an object.
func FuzzTop(f *testing.F) {
	// Invalid UTF-8 in a later name decodes to U+FFFD, which may be the name looked for.
	f.Add([]byte("{\"\uFFFD\":1,\"\xff\":2}"), "\uFFFD")
	f.Add([]byte(`{"k":1,"x":"\"k\"","k":3}`), "k")
	f.Add([]byte(`{"k":1,"x":"k","y":"\"k"}`), "k")
	for _, s := range []string{`{"k":"a"}`, `{"k":1,"k":2}`, `{"a":{"k":3},"k":[1]}`, ` {"k" : "\u00e9"} `, `[1]`, `{"k":}`, `{}`, `{"k":"a"}x`} {
		f.Add([]byte(s), "k")
	}
	f.Fuzz(func(t *testing.T, obj []byte, name string) {
		if !json.Valid(obj) {
			return // Top's precondition; the source checks it first
		}
		got, ok, err := Top(obj, name)
		var m map[string]json.RawMessage
		stdErr := json.Unmarshal(obj, &m)
		if stdErr != nil || m == nil {
			if err == nil {
				t.Fatalf("%q: std refused (%v) what Top took as an object", obj, stdErr)
			}
			return
		}
		if err != nil {
			t.Fatalf("%q: %v, std decoded it", obj, err)
		}
		want, wok := m[name]
		if ok != wok || !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(want)) {
			t.Fatalf("%q field %q: got %q %v, std %q %v", obj, name, got, ok, want, wok)
		}
	})
}

// FuzzTopKey checks TopKey against Top then Key, which FuzzTop checks against encoding/json.
func FuzzTopKey(f *testing.F) {
	for _, s := range []string{`{"k":"a"}`, `{"k":"a","k":"b\u00e9"}`, `{"k":"\u0041"}`, `{"k":"é"}`, `{"k":12,"x":"y"}`, `{"k":true}`, `{"k":null}`, `{"k":{}}`, `{}`, `{"k":""}`} {
		f.Add([]byte(s), "k")
	}
	f.Fuzz(func(t *testing.T, obj []byte, name string) {
		if !json.Valid(obj) {
			return
		}
		got, ok, err := TopKey(obj, name)
		raw, wok, werr := Top(obj, name)
		if (err != nil) != (werr != nil) && werr != nil || ok != wok {
			t.Fatalf("%q %q: TopKey %q %v %v, Top %q %v %v", obj, name, got, ok, err, raw, wok, werr)
		}
		if !wok || werr != nil {
			return
		}
		want, kerr := Key(raw)
		if (err != nil) != (kerr != nil) || !bytes.Equal(got, want) {
			t.Fatalf("%q %q: TopKey %q %v, Key(Top) %q %v", obj, name, got, err, want, kerr)
		}
	})
}
