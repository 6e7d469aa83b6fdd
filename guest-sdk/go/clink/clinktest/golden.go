//go:build !wasip1

package clinktest

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// CheckGolden runs the operator natively over dir/input.jsonl, keyed by keyField, and compares
// the output with dir/expected.jsonl; with update set it first rewrites expected.jsonl from the
// output. The examples keep these files beside their sources, and the host's tests check the
// built .wasm modules against the same files.
func CheckGolden(t testing.TB, dir, keyField string, update bool) {
	t.Helper()
	in, err := os.Open(filepath.Join(dir, "input.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	got, err := RunJSONL(in, keyField)
	if err != nil {
		t.Fatal(err)
	}
	expected := filepath.Join(dir, "expected.jsonl")
	if update {
		if err := os.WriteFile(expected, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(expected)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s:\n%s", expected, got)
	}
}
