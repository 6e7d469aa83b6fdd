package state

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/state/internal/format"
)

// sortDurable must give exactly the order of one sort by durable key, across key groups,
// state names, records that are prefixes of one another and entry suffixes.
func TestSortDurableMatchesSort(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 7, 1000, 20000} {
		ents := make([]format.SegEntry, n)
		for i := range ents {
			rec := fmt.Appendf(nil, "u%d", r.IntN(n+1))
			name := []string{"count", "c", "count2"}[r.IntN(3)]
			ent := []byte(nil)
			if r.IntN(4) == 0 {
				ent = []byte{byte(r.IntN(3))}
			}
			ents[i] = format.SegEntry{Key: format.AppendDurableKey(nil, KeyGroupOf(rec, 128), name, rec, ent), Value: []byte{byte(i)}}
		}
		want := slices.Clone(ents)
		slices.SortStableFunc(want, func(x, y format.SegEntry) int { return bytes.Compare(x.Key, y.Key) })
		order := sortDurable(len(ents), func(i int) []byte { return ents[i].Key })
		got := make([]format.SegEntry, len(order))
		for i, j := range order {
			got[i] = ents[j]
		}
		if len(got) != len(want) {
			t.Fatalf("n=%d: %d entries, want %d", n, len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i].Key, want[i].Key) {
				t.Fatalf("n=%d: entry %d has key %x, want %x", n, i, got[i].Key, want[i].Key)
			}
		}
	}
}

// BenchmarkSortDurable: a checkpoint's worth of counter keys (100k records, one state).
func BenchmarkSortDurable(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	keys := make([][]byte, 100_000)
	for i := range keys {
		rec := fmt.Appendf(nil, "k%d", r.IntN(1_000_000))
		keys[i] = format.AppendDurableKey(nil, KeyGroupOf(rec, 128), "count", rec, nil)
	}
	for b.Loop() {
		sortDurable(len(keys), func(i int) []byte { return keys[i] })
	}
}
