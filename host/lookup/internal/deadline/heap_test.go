package deadline

import (
	"math/rand/v2"
	"slices"
	"testing"
)

type item struct {
	at, idx int
}

func (x *item) Before(o *item) bool { return x.at < o.at }
func (x *item) SetIndex(i int)      { x.idx = i }
func (x *item) Index() int          { return x.idx }

// TestHeapAgainstSorted: random pushes, pops and removals agree with a sorted slice, and
// every item's index stays true.
func TestHeapAgainstSorted(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var h Heap[*item]
		var ref []*item
		for range 300 {
			switch op := rng.IntN(10); {
			case op < 5:
				x := &item{at: rng.IntN(50), idx: -1}
				h.Push(x)
				ref = append(ref, x)
			case op < 7 && len(ref) > 0:
				x := h.Pop()
				m := slices.MinFunc(ref, func(a, b *item) int { return a.at - b.at })
				if x.at != m.at {
					t.Fatalf("round %d: Pop gave %d, min is %d", round, x.at, m.at)
				}
				ref = slices.DeleteFunc(ref, func(y *item) bool { return y == x })
			case len(ref) > 0:
				x := ref[rng.IntN(len(ref))]
				h.Remove(x)
				h.Remove(x) // a second Remove is a no-op
				ref = slices.DeleteFunc(ref, func(y *item) bool { return y == x })
			}
			if h.Len() != len(ref) {
				t.Fatalf("round %d: Len %d, want %d", round, h.Len(), len(ref))
			}
			for i, x := range h.items {
				if x.idx != i {
					t.Fatalf("round %d: item at %d records index %d", round, i, x.idx)
				}
			}
			for _, x := range ref {
				if x.idx < 0 {
					t.Fatalf("round %d: an item in the heap records -1", round)
				}
			}
		}
		all := slices.Clone(h.items)
		h.Clear()
		for _, x := range all {
			if x.idx != -1 || h.Len() != 0 {
				t.Fatal("Clear left an item marked in the heap")
			}
		}
	}
}

func TestHeapNoAllocations(t *testing.T) {
	var h Heap[*item]
	xs := make([]*item, 64)
	for i := range xs {
		xs[i] = &item{at: i * 7 % 64, idx: -1}
	}
	for _, x := range xs {
		h.Push(x)
	}
	for h.Len() > 0 {
		h.Pop()
	}
	if n := testing.AllocsPerRun(100, func() {
		for _, x := range xs {
			h.Push(x)
		}
		for h.Len() > 0 {
			h.Pop()
		}
	}); n != 0 {
		t.Fatalf("%v allocations per run", n)
	}
}
