package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
)

// TestRenameMain rewrites a real profile (this test binary's goroutines, which name this
// package's functions by its import path) and checks the result: the package's functions are
// main.*, nothing else changed, and the output is still a profile the same code can read.
func TestRenameMain(t *testing.T) {
	const pkg = "github.com/clink-wasm/clink-wasm/guest-sdk/go/cmd/clink-pgo"
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 0); err != nil {
		t.Fatal(err)
	}
	before := stringsOf(t, b.Bytes())
	out, n, err := renameMain(b.Bytes(), pkg)
	if err != nil {
		t.Fatal(err)
	}
	after := stringsOf(t, out)
	if len(after) != len(before) {
		t.Fatalf("%d strings after, %d before", len(after), len(before))
	}
	renamed := 0
	for i, s := range before {
		want := s
		if strings.HasPrefix(s, pkg+".") {
			want = "main." + strings.TrimPrefix(s, pkg+".")
			renamed++
		}
		if after[i] != want {
			t.Errorf("string %d: %q, want %q", i, after[i], want)
		}
	}
	if renamed == 0 || n != renamed {
		t.Errorf("renamed %d strings, want %d (and at least this test's own name)", n, renamed)
	}
	if !slices.Contains(after, "main.TestRenameMain") {
		t.Errorf("main.TestRenameMain not in the rewritten profile")
	}
}

func TestRenameMalformed(t *testing.T) {
	for _, msg := range [][]byte{
		{0x32, 0x05, 'a'}, // a string longer than the message
		{0x33},            // wire type 3 (groups) is not in profile.proto
		{0x08, 0xff},      // a truncated varint
		{0x32},            // a length that is missing
	} {
		if _, _, err := rewriteStrings(msg, "a.", "main."); err == nil {
			t.Errorf("% x: no error", msg)
		}
	}
}

func stringsOf(t *testing.T, profile []byte) []string {
	t.Helper()
	// Rewriting with a prefix no string has returns the message as it was, and is a parse.
	out, _, err := renameMain(profile, "\x00")
	if err != nil {
		t.Fatal(err)
	}
	raw := gunzip(t, out)
	var ss []string
	for i := 0; i < len(raw); {
		tag, l := uvarint(raw[i:])
		i += l
		switch tag & 7 {
		case 0:
			_, l := uvarint(raw[i:])
			i += l
		case 2:
			size, l := uvarint(raw[i:])
			body := raw[i+l : i+l+int(size)]
			i += l + int(size)
			if tag>>3 == stringTable {
				ss = append(ss, string(body))
			}
		default:
			t.Fatalf("wire type %d at %d", tag&7, i)
		}
	}
	return ss
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
