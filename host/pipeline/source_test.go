package pipeline

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/clink-wasm/clink-wasm/host/scheduler"
)

func TestTopLevelField(t *testing.T) {
	obj := []byte(`{"a":1, "nested":{"user":"inner"}, "s":"x\"y", "user" : "bob", "arr":[{"user":2}], "esc\u0061pe":true}`)
	for _, c := range []struct{ name, want string }{
		{"a", "1"}, {"user", `"bob"`}, {"s", `"x\"y"`}, {"arr", `[{"user":2}]`}, {"escape", "true"},
	} {
		got, ok := topLevelField(obj, c.name)
		if !ok || string(got) != c.want {
			t.Errorf("%s: got %q %v, want %q", c.name, got, ok, c.want)
		}
	}
	if _, ok := topLevelField(obj, "missing"); ok {
		t.Error("found a missing field")
	}
	if _, ok := topLevelField([]byte(`[1,2]`), "a"); ok {
		t.Error("found a field in an array")
	}
}

// FuzzTopLevelField checks the scanner against encoding/json on every valid JSON object.
func FuzzTopLevelField(f *testing.F) {
	f.Add([]byte(`{"user":"a","n":1}`), "user")
	f.Add([]byte(`{"x":{"user":1},"user":[1,"]"],"u\"ser":2}`), "user")
	f.Add([]byte(` { "k" : null , "k2":"\\"} `), "k2")
	f.Fuzz(func(t *testing.T, obj []byte, name string) {
		// encoding/json turns invalid UTF-8 into U+FFFD while the scanner matches raw bytes;
		// compare only where both see the same names.
		if !json.Valid(obj) || !utf8.Valid(obj) || !utf8.ValidString(name) {
			return
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(obj, &m) != nil {
			return // not an object
		}
		got, ok := topLevelField(obj, name)
		want, wok := m[name]
		if ok != wok {
			t.Fatalf("field %q: scanner found=%v, json found=%v in %s", name, ok, wok, obj)
		}
		if ok && !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(want)) {
			t.Fatalf("field %q: scanner %q, json %q", name, got, want)
		}
	})
}

func TestKeyTextAndTime(t *testing.T) {
	for raw, want := range map[string]string{`"bob"`: "bob", `"b\u00f6b"`: "böb", `42`: "42", `true`: "true"} {
		k, err := keyText([]byte(raw))
		if err != nil || string(k) != want {
			t.Errorf("%s: %q %v", raw, k, err)
		}
	}
	for _, raw := range []string{`null`, `{}`, `[1]`} {
		if _, err := keyText([]byte(raw)); err == nil {
			t.Errorf("%s accepted as a key", raw)
		}
	}
	if ts, err := parseTime([]byte(`"2026-11-30T08:00:00Z"`)); err != nil || ts != time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC).UnixMilli() {
		t.Errorf("RFC 3339: %d %v", ts, err)
	}
	if ts, err := parseTime([]byte(`1700000000123`)); err != nil || ts != 1700000000123 {
		t.Errorf("epoch ms: %d %v", ts, err)
	}
	if _, err := parseTime([]byte(`"yesterday"`)); err == nil {
		t.Error("accepted a bad time")
	}
}

func runSource(t *testing.T, cfg sourceConfig, input string) ([]scheduler.Element, *bytes.Buffer, error) {
	t.Helper()
	dl := &bytes.Buffer{}
	if cfg.deadLetter == nil {
		cfg.deadLetter = dl
	}
	if cfg.maxKey == 0 {
		cfg.maxKey, cfg.maxValue = 1<<10, 1<<10
	}
	s := newSource(cfg, strings.NewReader(input))
	ch := make(chan []scheduler.Element, 100)
	err := s.run(ch, make(chan struct{}))
	var els []scheduler.Element
	for b := range ch {
		els = append(els, b...)
	}
	return els, dl, err
}

func TestSourceCSV(t *testing.T) {
	els, _, err := runSource(t, sourceConfig{format: FormatCSV, keyField: "user"},
		"user,amount,zip,note\nann,3.5,02134,\"hi, \"\"you\"\"\"\nbob,-2,10001,\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(els) != 3 { // two records and the final watermark
		t.Fatalf("%d elements", len(els))
	}
	if got := string(els[0].Value); got != `{"user":"ann","amount":3.5,"zip":"02134","note":"hi, \"you\""}` {
		t.Errorf("row 1: %s", got)
	}
	if string(els[1].Key) != "bob" || els[1].Pos != 3 {
		t.Errorf("row 2: key %q pos %d", els[1].Key, els[1].Pos)
	}
	if els[2].Kind != scheduler.ElementWatermark || els[2].TS != math.MaxInt64 {
		t.Errorf("no final watermark: %+v", els[2])
	}
}

func TestSourceWatermarks(t *testing.T) {
	var in strings.Builder
	for i := range 10 {
		in.WriteString(`{"k":"a","ts":` + []string{"1000", "1500", "1200", "2000", "1900", "2500", "2400", "3000", "2900", "3500"}[i] + "}\n")
	}
	els, _, err := runSource(t, sourceConfig{keyField: "k", timeField: "ts", watermarkDelay: 100 * time.Millisecond, watermarkEvery: 3}, in.String())
	if err != nil {
		t.Fatal(err)
	}
	var wms []int64
	for _, e := range els {
		if e.Kind == scheduler.ElementWatermark {
			wms = append(wms, e.TS)
		}
	}
	// Every 3 records: max ts seen - 100 ms; never backwards; +inf at the end.
	want := []int64{1400, 2400, 2900, math.MaxInt64}
	if len(wms) != len(want) {
		t.Fatalf("watermarks %v, want %v", wms, want)
	}
	for i := range want {
		if wms[i] != want[i] {
			t.Fatalf("watermarks %v, want %v", wms, want)
		}
	}
}

func TestSourceLongLine(t *testing.T) {
	long := `{"k":"` + strings.Repeat("x", 4<<10) + `"}`
	els, dl, err := runSource(t, sourceConfig{keyField: "k", policy: MalformedSkip}, `{"k":"a"}`+"\n"+long+"\n"+`{"k":"b"}`+"\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(els) != 3 || string(els[1].Key) != "b" {
		t.Fatalf("elements %v", els)
	}
	if !strings.Contains(dl.String(), `"line":2`) || !strings.Contains(dl.String(), "limit") {
		t.Errorf("dead letter: %s", dl)
	}
	_, _, err = runSource(t, sourceConfig{keyField: "k"}, `{"k":"a"}`+"\n"+long+"\n")
	if err == nil || !strings.Contains(err.Error(), "input line 2") {
		t.Fatalf("fail policy: %v", err)
	}
}
