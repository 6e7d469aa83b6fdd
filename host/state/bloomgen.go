package state

import (
	"github.com/clink-wasm/clink-wasm/host/state/internal/format"
)

// # Filter generations
//
// A read that misses the hot tier asks every live segment whose key range holds the key for its
// bloom filter (mayBeDurable): ~26 ns a segment (BenchmarkGetAbsent), and a subtask accumulates
// many small segments between compactions (a checkpoint delta or a spill each). Filters of
// different sizes cannot be merged, so the segments this backend encodes also go into a filter
// generation: one filter over the keys of several segments, built from their keys' hashes as
// they are encoded. A generation that rules a key out rules it out for all its segments with
// one probe sequence; only when it lets the key through are its segments asked one by one.
//
// The open generation takes segments until it holds its capacity in keys; then it is sealed
// and the next one opens with twice the capacity (from minGenKeys to maxGenKeys), so a run of
// segments of any size needs O(log n) generations, and a key is probed against at most
// maxGens of them. A generation is immutable once a version holds it: adding a segment copies
// the open one's bits first (at most maxGenKeys × bloom_bits / 8 bytes). It is dropped with its
// last live segment. A segment compacted away leaves its keys' bits in its generation until
// then: they only let more keys through to the per-segment filters, never rule one out.
// Segments this backend did not encode (restored, or compaction outputs) have no generation
// and are asked one by one, as before. The generations' bits count in the hot budget with the
// segment indexes (countIndexes), and are at most a sixteenth of it (genBudgetShare).

const (
	minGenKeys = 1024
	maxGenKeys = 1 << 20
	maxGens    = 8 // the probe mask of mayBeDurable is a uint8
	// genBitsPerKey: ~1% of the keys a generation does not hold get through to its
	// segments' own filters (16 bits, theirs, would double its memory for 0.05%).
	genBitsPerKey = 10
	// genBudgetShare: the generations hold at most 1/genBudgetShare of the subtask's hot
	// budget; a segment that would need more gets no generation.
	genBudgetShare = 16
)

// bloomGen is one filter generation.
type bloomGen struct {
	bloom format.Bloom
	keys  int // hashes added
	cap   int // keys it is sized for
}

// genState is Tiered.mu's record of the generations.
type genState struct {
	gens map[uint64]*bloomGen
	of   map[string]uint64 // segment name -> its generation
	open uint64            // the generation taking segments; 0: none
	next uint64
	last int // the capacity of the last generation opened
}

// addToGenLocked adds the segment name, whose keys hash to hashes, to the open generation
// (opening one if needed). Without hashes, or with maxGens generations live, it gets none.
func (b *Tiered) addToGenLocked(name string, hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	g := &b.mu.gens
	if g.gens == nil {
		g.gens, g.of = map[uint64]*bloomGen{}, map[string]uint64{}
	}
	cur := g.gens[g.open]
	if cur == nil || cur.keys+len(hashes) > cur.cap {
		if len(g.gens) >= maxGens {
			return
		}
		c := min(max(2*g.last, minGenKeys, len(hashes)), max(maxGenKeys, len(hashes)))
		used := int64(0)
		for _, o := range g.gens {
			used += int64(o.bloom.Bytes())
		}
		if limit := b.member.limit.Load(); limit > 0 && used+int64(c*genBitsPerKey/8) > limit/genBudgetShare {
			return
		}
		g.next++
		g.open, g.last = g.next, c
		cur = &bloomGen{bloom: format.NewBloom(c, genBitsPerKey), cap: c}
	} else {
		// Versions hold the open generation's bits: add to a copy.
		cur = &bloomGen{bloom: cur.bloom.Clone(), keys: cur.keys, cap: cur.cap}
	}
	for _, h := range hashes {
		cur.bloom.Add(h)
	}
	cur.keys += len(hashes)
	g.gens[g.open] = cur
	g.of[name] = g.open
}

// versionGensLocked gives v, whose segments are built, the generations of its segments, and
// forgets the generations (and segment names) no live segment has any more.
func (b *Tiered) versionGensLocked(v *version) {
	g := &b.mu.gens
	if len(g.of) == 0 {
		return
	}
	// A generation with one live segment saves nothing over that segment's own filter: the
	// version leaves it out (it stays, for the segments to come).
	members := map[uint64]int{}
	for _, s := range v.segs {
		if id, ok := g.of[s.ref.Name]; ok && s.ref.Use == b.rng {
			members[id]++
		}
	}
	idx := map[uint64]int8{}
	v.segGen = make([]int8, len(v.segs))
	for i, s := range v.segs {
		id, ok := g.of[s.ref.Name]
		if !ok || s.ref.Use != b.rng || members[id] < 2 {
			// (Only segments we encoded have a generation, and those use our range.)
			v.segGen[i] = -1
			continue
		}
		j, ok := idx[id]
		if !ok {
			j = int8(len(v.gens))
			idx[id] = j
			v.gens = append(v.gens, g.gens[id].bloom)
		}
		v.segGen[i] = j
	}
	for name := range g.of {
		if b.mu.live[name] == nil {
			delete(g.of, name)
		}
	}
	for id := range g.gens {
		if members[id] == 0 && id != g.open {
			delete(g.gens, id)
		}
	}
	if len(v.gens) == 0 {
		v.segGen = nil
	}
}
