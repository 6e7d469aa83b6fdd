package jsonfield

import (
	"encoding/json"
	"strings"
	"testing"
)

var validCases = []string{
	`{}`, ` {} `, "\t\r\n1\t", `[]`, `[1,2,[3,{"a":[]}]]`, `{"a":1,"a":2}`, `{"a" : {"b":[true,false,null]}}`,
	`"\ud800"`, "\"\xff\"", "\"\x7f\"", `"\u00e9\n\t\"\\\/\b\f\r"`, `-0`, `0`, `1e5`, `1E+5`, `2.5e-3`, `-12.50E-07`,
	``, ` `, `01`, `-`, `1.`, `.5`, `1e`, `1e+`, `+1`, `--1`, `0x1`, `[1,]`, `[,1]`, `{"a":1,}`, `{,}`, `{"a"}`,
	`{"a":}`, `{1:2}`, `{"a" 1}`, `[1 2]`, `1 2`, `nul`, `nulll`, `tru`, `True`, `"\u12"`, `"\uZZZZ"`, `"\x"`,
	"\"\x1f\"", "\"a", `"\`, "\ufeff{}", "\x00", `]`, `}`, `[}`, `{]`, `[[]`, `[]]`, `{"a":[}`, `"a"x`,
	strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
	strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	strings.Repeat(`{"a":`, 9999) + `[]` + strings.Repeat("}", 9999),
	strings.Repeat(`{"a":`, 10000) + `[]` + strings.Repeat("}", 10000),
	strings.Repeat("[", 65) + strings.Repeat("]", 64), strings.Repeat("[{\"k\":", 70) + "1" + strings.Repeat("}]", 70),
}

// TestValid: Valid agrees with encoding/json.Valid on hand-picked cases, each side of every rule.
func TestValid(t *testing.T) {
	for _, c := range validCases {
		if got, want := Valid([]byte(c)), json.Valid([]byte(c)); got != want {
			t.Errorf("Valid(%.40q) = %v, encoding/json says %v", c, got, want)
		}
	}
}

// FuzzValid: on any bytes, Valid is encoding/json.Valid.
func FuzzValid(f *testing.F) {
	for _, c := range validCases {
		if len(c) < 200 {
			f.Add([]byte(c))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Fatalf("Valid(%q) = %v, encoding/json says %v", b, got, want)
		}
	})
}

func BenchmarkValid(b *testing.B) {
	line := []byte(`{"user":"user-48213","seq":123456,"tags":["a","b"],"score":-12.5e3,"ok":true,"note":"caf\u00e9 \"q\""}`)
	for _, v := range []struct {
		name string
		f    func([]byte) bool
	}{{"jsonfield", Valid}, {"encoding-json", json.Valid}} {
		b.Run(v.name, func(b *testing.B) {
			b.SetBytes(int64(len(line)))
			for b.Loop() {
				if !v.f(line) {
					b.Fatal("invalid")
				}
			}
		})
	}
}
