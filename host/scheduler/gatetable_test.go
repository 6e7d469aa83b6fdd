package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestGateTable checks the gate's table against a map through random inserts, removals and
// probes, with hashes drawn from a few values so that keys collide, probe sequences cluster
// and wrap around the table's end, and removals shift long runs back; the table grows and
// shrinks on the way.
func TestGateTable(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, seed))
		gt := newGateTable()
		ref := map[string]*gateEntry{}
		hashes := 1 + rng.IntN(300) // distinct hash values in play
		hashOf := func(k string) uint64 {
			var h uint64
			for _, c := range []byte(k) {
				h = h*31 + uint64(c)
			}
			return h % uint64(hashes) * 0x9E3779B97F4A7C15 // spread over the table's slots
		}
		keys := 1 + rng.IntN(2000)
		for op := range 20_000 {
			k := fmt.Sprint("k", rng.IntN(keys))
			h := hashOf(k)
			switch g := ref[k]; {
			case g == nil && rng.IntN(3) > 0:
				g = &gateEntry{key: []byte(k), hash: h}
				gt.insert(g)
				ref[k] = g
			case g != nil && rng.IntN(2) == 0:
				gt.remove(g)
				delete(ref, k)
			}
			if got := gt.find(h, []byte(k)); got != ref[k] {
				t.Fatalf("seed %d op %d: find(%s) = %p, want %p", seed, op, k, got, ref[k])
			}
			if gt.n != len(ref) {
				t.Fatalf("seed %d op %d: %d entries, want %d", seed, op, gt.n, len(ref))
			}
			if op%1000 == 0 {
				for k, g := range ref {
					if got := gt.find(hashOf(k), []byte(k)); got != g {
						t.Fatalf("seed %d op %d: find(%s) = %p, want %p", seed, op, k, got, g)
					}
				}
				if 2*gt.n > len(gt.slots) && gt.n > 0 {
					t.Fatalf("seed %d: %d entries in %d slots, more than half full", seed, gt.n, len(gt.slots))
				}
			}
		}
		// Drain: the table shrinks back and finds nothing.
		for k, g := range ref {
			gt.remove(g)
			delete(ref, k)
			if gt.find(hashOf(k), []byte(k)) != nil {
				t.Fatalf("seed %d: %s found after its removal", seed, k)
			}
		}
		if gt.n != 0 || len(gt.slots) > gateTableMin {
			t.Fatalf("seed %d: empty table holds %d entries in %d slots", seed, gt.n, len(gt.slots))
		}
	}
}

// TestGateTableRemoveAbsent: removing an entry that is not in the table is an invariant
// violation, reported instead of looping.
func TestGateTableRemoveAbsent(t *testing.T) {
	gt := newGateTable()
	gt.insert(&gateEntry{key: []byte("a"), hash: 1})
	defer func() {
		if recover() == nil {
			t.Fatal("removing an absent entry did not panic")
		}
	}()
	gt.remove(&gateEntry{key: []byte("b"), hash: 1})
}
