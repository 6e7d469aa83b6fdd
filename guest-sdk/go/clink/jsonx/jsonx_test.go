package jsonx

import (
	"encoding/json"
	"math"
	"strconv"
	"testing"
	"unicode/utf8"
)

func TestField(t *testing.T) {
	obj := []byte(` { "a" : 1, "b":"x\"y", "c":{"d":[1,{"e":"}"}]}, "n":-12 ,"a":2, "s":"é"}`)
	for _, tc := range []struct {
		name, want string
		ok         bool
	}{
		{"a", "1", true},
		{"b", `"x\"y"`, true},
		{"c", `{"d":[1,{"e":"}"}]}`, true},
		{"n", "-12", true},
		{"s", `"é"`, true},
		{"e", "", false},
		{"d", "", false},
	} {
		got, ok := Field(obj, tc.name)
		if ok != tc.ok || string(got) != tc.want {
			t.Errorf("Field(%q) = %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	for _, bad := range []string{``, `[]`, `{`, `{"a"}`, `{"a":}`, `{"a":1 "b":2}`, `{"a":"x`, `{"a":[1}`, `"a"`} {
		if _, ok := Field([]byte(bad), "b"); ok {
			t.Errorf("Field(%q, b) = ok", bad)
		}
	}
}

func TestParseInt(t *testing.T) {
	for _, s := range []string{"0", "-0", "7", "-7", "123456789", "9223372036854775807", "-9223372036854775808"} {
		want, _ := strconv.ParseInt(s, 10, 64)
		got, ok := ParseInt([]byte(s))
		if !ok || got != want {
			t.Errorf("ParseInt(%q) = %d, %v", s, got, ok)
		}
	}
	for _, s := range []string{"", "-", "+1", "01", "-01", "1.0", "1e3", "9223372036854775808", "-9223372036854775809", `"1"`, "1a", "true", "99999999999999999999"} {
		if v, ok := ParseInt([]byte(s)); ok {
			t.Errorf("ParseInt(%q) = %d, ok", s, v)
		}
	}
}

func TestAppendString(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uote`, `back\slash`, "tab\tnl\ncr\rbs\bff\f", "\x00\x01\x1f\x7f", "ünïcødé 日本 🎉", "</script>&"} {
		got := AppendString(nil, []byte(s))
		var back string
		if err := json.Unmarshal(got, &back); err != nil || back != s {
			t.Errorf("AppendString(%q) = %s: round trip %q, %v", s, got, back, err)
		}
	}
	if got := string(AppendString(nil, []byte("a\x01\"<"))); got != `"a\u0001\"<"` {
		t.Errorf("got %s", got)
	}
	if got := string(AppendInt(nil, math.MinInt64)); got != "-9223372036854775808" {
		t.Errorf("got %s", got)
	}
}

func FuzzField(f *testing.F) {
	f.Add([]byte(`{"a":1,"b":[{"c":"\""}]}`), "b")
	f.Fuzz(func(t *testing.T, obj []byte, name string) {
		raw, ok := Field(obj, name)
		if ok && len(raw) == 0 {
			t.Fatalf("ok with an empty value")
		}
		if ok && json.Valid(obj) && !json.Valid(raw) {
			t.Fatalf("valid object %q gave invalid value %q", obj, raw)
		}
	})
}

func TestAppendUnquote(t *testing.T) {
	for _, raw := range []string{`""`, `"plain"`, `"q\"b\\s\/"`, `"\b\f\n\r\t"`, `"\u00e9\u65E5"`, `"\ud83c\udf89"`, `"\ud83c"`, `"\udf89x"`, `"\ud83c\u0041"`, `"ünï"`} {
		var want string
		if err := json.Unmarshal([]byte(raw), &want); err != nil {
			t.Fatal(raw, err)
		}
		got, ok := AppendUnquote([]byte("pre:"), []byte(raw))
		if !ok || string(got) != "pre:"+want {
			t.Errorf("AppendUnquote(%s) = %q, %v; want %q", raw, got, ok, want)
		}
	}
	for _, raw := range []string{``, `"`, `abc`, `"a\"`, `"\x"`, `"\u12"`, `"\u12G4"`, "\"a\nb\"", `"a"b"`} {
		if got, ok := AppendUnquote(nil, []byte(raw)); ok {
			t.Errorf("AppendUnquote(%q) = %q, ok", raw, got)
		}
	}
}

func FuzzAppendUnquote(f *testing.F) {
	f.Add([]byte(`"a\u00e9\ud83c\udf89\n"`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := AppendUnquote(nil, raw)
		var want string
		err := json.Unmarshal(raw, &want)
		if !utf8.Valid(raw) || len(raw) == 0 || raw[0] != '"' || raw[len(raw)-1] != '"' {
			return // encoding/json also accepts surrounding space and fixes invalid UTF-8
		}
		if (err == nil) != ok || (ok && string(got) != want) {
			t.Fatalf("AppendUnquote(%q) = %q, %v; encoding/json: %q, %v", raw, got, ok, want, err)
		}
	})
}

// FuzzAppendString checks the fast paths of AppendString (eight bytes at a time, the direct
// write into spare room) against the byte-by-byte escaper, for every prefix and capacity.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "user-1234", "a\"b", "0123456789abcdef\\", "\x00\x1f\x20\x7f\xff", "é€😀", "abcdefg\n"} {
		f.Add([]byte(s), 0)
	}
	f.Fuzz(func(t *testing.T, s []byte, spare int) {
		want := appendEscaped([]byte("x"), s, 0)
		dst := make([]byte, 1, 1+max(0, spare%64))
		dst[0] = 'x'
		if got := AppendString(dst, s); string(got) != string(want) {
			t.Fatalf("AppendString(%q) = %q, want %q", s, got, want)
		}
	})
}

func TestAppendInt(t *testing.T) {
	for _, v := range []int64{0, 1, 9, 10, 99, 100, -1, -10, 12345, math.MaxInt64, math.MinInt64, math.MinInt64 + 1, 1e18, -1e18} {
		for _, c := range []int{0, 19, 20, 64} {
			dst := make([]byte, 2, 2+c)
			dst[0], dst[1] = 'a', 'b'
			if got, want := string(AppendInt(dst, v)), "ab"+strconv.FormatInt(v, 10); got != want {
				t.Errorf("AppendInt(%d) with %d spare = %q, want %q", v, c, got, want)
			}
		}
	}
}
