package pipeline

import (
	"fmt"
	"strings"
	"testing"
)

// interleaving reports whether out's lines are exactly an interleaving of the per-key sequences:
// every line used once (the multiset of outputs), each key's lines in their order. Under order key
// the ABI (docs/abi.md) guarantees only per-key order, so a test over several keys must accept
// every interleaving and nothing else.
func interleaving(out string, perKey ...[]string) error {
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if out == "" {
		lines = nil
	}
	n := 0
	for _, s := range perKey {
		n += len(s)
	}
	if len(lines) != n {
		return fmt.Errorf("%d output lines, want %d: %q", len(lines), n, out)
	}
	// Depth-first over the next index of each key; the inputs are small.
	var walk func(i int, next []int) bool
	walk = func(i int, next []int) bool {
		if i == len(lines) {
			return true
		}
		for k, s := range perKey {
			if next[k] < len(s) && s[next[k]] == lines[i] {
				next[k]++
				if walk(i+1, next) {
					return true
				}
				next[k]--
			}
		}
		return false
	}
	if !walk(0, make([]int, len(perKey))) {
		return fmt.Errorf("output %q is not an interleaving of the per-key sequences %q", out, perKey)
	}
	return nil
}

// counts is the counter fixture's outputs for the counts given, one line each.
func counts(n ...int) []string {
	s := make([]string, len(n))
	for i, c := range n {
		s[i] = fmt.Sprintf("{\"count\":%d}", c)
	}
	return s
}

func TestInterleaving(t *testing.T) {
	a, b := counts(1, 2), counts(1)
	for _, ok := range []string{"{\"count\":1}\n{\"count\":1}\n{\"count\":2}\n", "{\"count\":1}\n{\"count\":2}\n{\"count\":1}\n"} {
		if err := interleaving(ok, a, b); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"{\"count\":2}\n{\"count\":1}\n{\"count\":1}\n", "{\"count\":1}\n{\"count\":2}\n", "{\"count\":1}\n{\"count\":2}\n{\"count\":2}\n", ""} {
		if err := interleaving(bad, a, b); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if err := interleaving("", nil); err != nil {
		t.Errorf("empty: %v", err)
	}
}
