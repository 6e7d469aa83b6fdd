package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// FuzzDecodeJSON checks decodeJSONBytes against encoding/json: it accepts exactly what a strict
// standard decoder accepts, decodes the same value, and otherwise returns a 400-class problem
// that names a field.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"name":"a"}`, `{"name":"a","quotas":{"max_pipelines":3}}`, `{"name":1}`, `{`, ``, `{"x":1}`,
		`{"quotas":{"allowed_lookup_hosts":["a",2]}}`, `{"name":"a"} 1`, `null`, `[]`, `{"quotas":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var ours tenantCreate
		err := decodeJSONBytes(body, &ours)
		var std tenantCreate
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		stdErr := dec.Decode(&std)
		if stdErr == nil && dec.More() {
			stdErr = errors.New("trailing data")
		}
		if len(bytes.TrimSpace(body)) == 0 {
			stdErr = errors.New("empty")
		}
		if (err == nil) != (stdErr == nil) {
			t.Fatalf("ours %v, std %v for %q", err, stdErr, body)
		}
		if err == nil {
			if !reflect.DeepEqual(ours, std) {
				t.Fatalf("decoded %+v, std %+v", ours, std)
			}
			return
		}
		var p *Problem
		if !errors.As(err, &p) || p.Status != 400 || p.Field == "" || p.Code == "" || p.Detail == "" {
			t.Fatalf("error %#v for %q", err, body)
		}
	})
}

// FuzzMergePatch checks RFC 7396 properties: the result is JSON, and applying a patch twice
// gives what applying it once does.
func FuzzMergePatch(f *testing.F) {
	f.Add([]byte(`{"a":1,"b":{"c":2}}`), []byte(`{"b":{"c":null,"d":3},"e":[1]}`))
	f.Add([]byte(`{"a":1}`), []byte(`[1,2]`))
	f.Add([]byte(`{}`), []byte(`{"a":{"b":{"c":null}}}`))
	f.Fuzz(func(t *testing.T, doc, patch []byte) {
		once, err := mergePatch(doc, patch)
		if err != nil {
			return
		}
		if !json.Valid(once) {
			t.Fatalf("invalid result %s", once)
		}
		twice, err := mergePatch(once, patch)
		if err != nil {
			t.Fatal(err)
		}
		var a, b any
		json.Unmarshal(once, &a)
		json.Unmarshal(twice, &b)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("not idempotent: %s then %s", once, twice)
		}
	})
}
