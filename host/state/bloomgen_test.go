package state

import (
	"fmt"
	"testing"
)

// TestFilterGenerations: the segments of many small checkpoints share filter generations; an
// absent key is answered without a read and without asking every segment's filter, a present
// key of any segment is never ruled out, and the generations' bits count in the index
// bytes, within a sixteenth of the budget.
func TestFilterGenerations(t *testing.T) {
	for _, budget := range []int64{0, 256 << 10} {
		t.Run(fmt.Sprint("budget-", budget), func(t *testing.T) {
			opts := []Option{WithMaxSegments(1 << 20)}
			if budget > 0 {
				opts = append(opts, WithHotBytes(budget))
			}
			s := openTest(t, "mem://", opts...)
			b := operator(t, s, OperatorOptions{})
			const segs, per = 40, 300
			for i := range segs {
				for j := range per {
					b.Put(key(0, fmt.Sprintf("k%d-%d", i, j), ""), []byte("v"))
				}
				checkpoint(t, b, uint64(i+1))
			}
			b.Get(key(0, "x", "")) // observes the commits
			v := b.version.Load()
			if len(v.segs) != segs || len(v.gens) == 0 {
				t.Fatalf("%d segments, %d generations", len(v.segs), len(v.gens))
			}
			inGen, genBytes := 0, int64(0)
			for _, g := range v.segGen {
				if g >= 0 {
					inGen++
				}
			}
			for _, g := range v.gens {
				genBytes += int64(g.Bytes())
			}
			if budget > 0 && genBytes > budget/genBudgetShare {
				t.Fatalf("generations hold %d bytes, more than a %dth of %d", genBytes, genBudgetShare, budget)
			}
			if m := b.Metrics(); m.IndexBytes < genBytes {
				t.Fatalf("index bytes %d do not count the generations' %d", m.IndexBytes, genBytes)
			}
			if budget == 0 && inGen != segs {
				t.Fatalf("%d of %d segments in a generation, unbounded", inGen, segs)
			}
			// Absent keys: answered at once, almost never let through by every filter.
			through := 0
			for i := range 2000 {
				if _, found, hot := b.Get(key(0, fmt.Sprint("absent-", i), "")); !hot {
					through++
				} else if found {
					t.Fatal("an absent key found")
				}
			}
			if through > 60 { // ~1% per generation, 0.05% per segment outside one
				t.Fatalf("%d of 2000 absent keys need a read", through)
			}
			// Every present key of every segment may be durable: no filter rules it out.
			for i := range segs {
				for j := range per {
					if k := key(0, fmt.Sprintf("k%d-%d", i, j), ""); !b.mayBeDurable(k) {
						t.Fatalf("segment %d's key %d ruled out", i, j)
					}
				}
			}
			t.Logf("%d segments, %d in %d generations of %d bytes; %d of 2000 absent keys let through", segs, inGen, len(v.gens), genBytes, through)
		})
	}
}
