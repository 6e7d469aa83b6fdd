package clink

import (
	"errors"
	"fmt"
	"testing"
)

type stringer struct{}

func (stringer) String() string { return "str" }

func TestAppendf(t *testing.T) {
	for _, tc := range []struct {
		format string
		args   []any
	}{
		{"plain", nil},
		{"%d %d %d %d", []any{1, int8(-2), int64(-1 << 63), uint64(1<<64 - 1)}},
		{"%x %x %x", []any{255, []byte{0, 0xab}, uint16(4096)}},
		{"%s|%v|%q", []any{"a\"b", "ü", "tab\t"}},
		{"%v %s %t", []any{errors.New("boom"), stringer{}, true}},
		{"%v %v", []any{1.5, float32(0.1)}},
		{"100%% %v", []any{nil}},
		{"%s", []any{[]byte("bytes")}},
	} {
		got := string(appendf(nil, tc.format, tc.args))
		want := fmt.Sprintf(tc.format, tc.args...)
		if got != want {
			t.Errorf("appendf(%q) = %q, fmt says %q", tc.format, got, want)
		}
	}
	if got := string(appendf(nil, "%d %d", []any{1})); got != "1 %!d(MISSING)" {
		t.Errorf("missing: %q", got)
	}
	if got := string(appendf(nil, "%v", []any{struct{}{}})); got != "%!v(unsupported)" {
		t.Errorf("unsupported: %q", got)
	}
}
