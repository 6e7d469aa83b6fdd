//go:build !wasip1

package main

import (
	"bytes"
	"flag"
	"os"
	"testing"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/clinktest"
)

var update = flag.Bool("update", false, "rewrite ../expected.jsonl from the output")

// TestExpected runs the operator natively over ../input.jsonl and compares with
// ../expected.jsonl. The same files check the built .wasm modules through the host.
func TestExpected(t *testing.T) {
	in, err := os.Open("../input.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	got, err := clinktest.RunJSONL(in, "user")
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile("../expected.jsonl", got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("../expected.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from ../expected.jsonl:\n%s", got)
	}
}
