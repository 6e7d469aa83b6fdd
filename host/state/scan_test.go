package state

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestScanRestored: a scan of a restored backend visits exactly the live entries of the
// checkpoint within its key groups, each once with its newest value, across several
// incremental checkpoints (overwrites and deletes in newer segments), spilled segments and a
// restore at another parallelism. Writes during the scan are not seen by it; a scan after a
// write is refused.
func TestScanRestored(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, "mem://scan", WithBlockSize(512), WithSegmentBytes(8<<10))
	w := operator(t, s, OperatorOptions{Name: "mig"})
	model := map[string]string{} // "state/record/entry" -> value
	rng := rand.New(rand.NewPCG(3, 4))
	for ck := range 4 {
		for range 3000 {
			st, rec, ent := rng.IntN(3), fmt.Sprint("r", rng.IntN(800)), fmt.Sprint("e", rng.IntN(3))
			if ent == "e0" {
				ent = ""
			}
			k := fmt.Sprintf("%s/%s/%s", testNames[st], rec, ent)
			if rng.IntN(5) == 0 {
				w.Delete(key(st, rec, ent))
				delete(model, k)
				continue
			}
			v := fmt.Sprintf("v%d-%d", ck, rng.IntN(1000))
			w.Put(key(st, rec, ent), []byte(v))
			model[k] = v
		}
		checkpoint(t, w, uint64(ck+1))
	}
	w.Close()
	for _, par := range []int{1, 3} {
		seen := map[string]string{}
		for i := range par {
			rng := KeyGroupRangeFor(i, par, 128)
			b := operator(t, s, OperatorOptions{Name: "mig", KeyGroups: rng, RestoreFrom: 4})
			err := b.ScanRestored(ctx, func(name string, record, entry, value []byte) error {
				k := fmt.Sprintf("%s/%s/%s", name, record, entry)
				if _, dup := seen[k]; dup {
					return fmt.Errorf("%s visited twice", k)
				}
				if !rng.Contains(KeyGroupOf(record, 128)) {
					return fmt.Errorf("%s is outside %v", k, rng)
				}
				seen[k] = string(value)
				// A migration writes every value back; the scan must not see it.
				b.Put(Key{State: StateID(indexOf(testNames, name)), Record: record, Entry: entry}, append([]byte("new-"), value...))
				return nil
			})
			if err != nil {
				t.Fatalf("parallelism %d, subtask %d: %v", par, i, err)
			}
			if err := b.ScanRestored(ctx, func(string, []byte, []byte, []byte) error { return nil }); !errors.Is(err, ErrScanAfterWrite) {
				t.Fatalf("a scan after writes: %v", err)
			}
			b.Close()
		}
		if len(seen) != len(model) {
			t.Fatalf("parallelism %d: %d entries scanned, want %d", par, len(seen), len(model))
		}
		for k, v := range model {
			if seen[k] != v {
				t.Fatalf("parallelism %d: %s = %q, want %q", par, k, seen[k], v)
			}
		}
	}
	// An error from fn stops the scan.
	b := operator(t, s, OperatorOptions{Name: "mig", RestoreFrom: 4})
	stop := errors.New("stop")
	n := 0
	if err := b.ScanRestored(ctx, func(string, []byte, []byte, []byte) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Fatalf("stopped scan: %v after %d", err, n)
	}
}

func indexOf(names []string, n string) int {
	for i, s := range names {
		if s == n {
			return i
		}
	}
	return -1
}
