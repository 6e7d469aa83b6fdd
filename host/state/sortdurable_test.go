package state

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// sortDurable must give exactly the order of one sort by durable key, across key groups,
// state names, records that are prefixes of one another and entry suffixes.
func TestSortDurableMatchesSort(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 7, 1000, 20000} {
		ents := make([]segEntry, n)
		for i := range ents {
			rec := fmt.Appendf(nil, "u%d", r.IntN(n+1))
			name := []string{"count", "c", "count2"}[r.IntN(3)]
			ent := []byte(nil)
			if r.IntN(4) == 0 {
				ent = []byte{byte(r.IntN(3))}
			}
			ents[i] = segEntry{key: appendDurableKey(nil, KeyGroupOf(rec, 128), name, rec, ent), value: []byte{byte(i)}}
		}
		want := slices.Clone(ents)
		slices.SortStableFunc(want, func(x, y segEntry) int { return bytes.Compare(x.key, y.key) })
		order := sortDurable(len(ents), func(i int) []byte { return ents[i].key })
		got := make([]segEntry, len(order))
		for i, j := range order {
			got[i] = ents[j]
		}
		if len(got) != len(want) {
			t.Fatalf("n=%d: %d entries, want %d", n, len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i].key, want[i].key) {
				t.Fatalf("n=%d: entry %d has key %x, want %x", n, i, got[i].key, want[i].key)
			}
		}
	}
}
