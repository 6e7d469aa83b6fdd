package state

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestCaptureGenerations captures several deltas before any persists, rewriting the same keys
// in between (in place, larger, deleted, put again), and checks that each checkpoint restores
// exactly the state at its capture: every persist reads its own generation's values while the
// runner writes the next ones (see entry).
func TestCaptureGenerations(t *testing.T) {
	const keys, rounds = 300, 6
	s := openTest(t, "mem://generations-"+randomHex(4), WithHotBytes(0))
	b := operator(t, s, OperatorOptions{Name: "gen"})
	rng := rand.New(rand.NewPCG(4, 2))
	model := map[int]string{}
	var models []map[int]string
	var snaps []Snapshot
	for r := range rounds {
		for range keys {
			i := rng.IntN(keys)
			switch rng.IntN(5) {
			case 0:
				b.Delete(key(0, fmt.Sprint(i), ""))
				delete(model, i)
			case 1: // larger than before: a new buffer
				v := fmt.Sprintf("round %d key %d with a longer value %d", r, i, rng.IntN(1e6))
				b.Put(key(0, fmt.Sprint(i), ""), []byte(v))
				model[i] = v
			default: // same size: written in place when no snapshot reads the old value
				v := fmt.Sprintf("r%d-%04d", r, i)
				b.Put(key(0, fmt.Sprint(i), ""), []byte(v))
				model[i] = v
			}
		}
		snap, err := b.Capture(uint64(r + 1))
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, snap)
		m := make(map[int]string, len(model))
		for k, v := range model {
			m[k] = v
		}
		models = append(models, m)
		// Sometimes let the earlier persists run while the runner goes on writing.
		if r == 2 {
			if err := snaps[1].Persist(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := snaps[len(snaps)-1].Persist(context.Background()); err != nil {
		t.Fatal(err)
	}
	for r := range rounds {
		rb := operator(t, s, OperatorOptions{Name: "gen", RestoreFrom: uint64(r + 1)})
		for i := range keys {
			v, ok := read(t, rb, key(0, fmt.Sprint(i), ""))
			want, wok := models[r][i]
			if ok != wok || string(v) != want {
				t.Fatalf("checkpoint %d key %d: got %q (found %v), want %q (found %v)", r+1, i, v, ok, want, wok)
			}
		}
		rb.Close()
	}
}
