package scheduler

import (
	"bytes"
	"hash/maphash"
)

// gateTable is the per-key gate's index of busy keys: each busy key's gateEntry, found by a
// hash of the key that a task computes once (taskHash) for its probe on admission, its entry
// when it suspends, and its release.
//
// It replaced a map[string]*gateEntry. On the suspension path nearly every record probes the
// gate and every suspended one enters and leaves it, and the map's string keys made each of
// those a hash of the key plus probes through groups of string headers and a compare of key
// bytes that had gone cold (8% of the runner's CPU in ColdPath/wat-suspend, insertion and
// deletion the larger part). Here a slot is the full 64-bit hash and the entry, 16 bytes: a
// probe compares hashes in one or two cache lines and reads the key bytes only on a hash
// match. Open addressing with linear probing at most half full, and backward-shift deletion,
// so no tombstones build up under the gate's constant churn.
type gateTable struct {
	slots []gateSlot // a power of two long, or empty
	n     int
	seed  maphash.Seed
}

// gateSlot is one slot of a gateTable: empty while g is nil.
type gateSlot struct {
	hash uint64
	g    *gateEntry
}

// gateTableMin is the smallest table; below it the table never shrinks.
const gateTableMin = 64

func newGateTable() gateTable { return gateTable{seed: maphash.MakeSeed()} }

func (gt *gateTable) hash(key []byte) uint64 { return maphash.Bytes(gt.seed, key) }

// find returns the entry of key (hash h), or nil if the key is not busy.
func (gt *gateTable) find(h uint64, key []byte) *gateEntry {
	if gt.n == 0 {
		return nil
	}
	mask := uint64(len(gt.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &gt.slots[i]
		if s.g == nil {
			return nil
		}
		if s.hash == h && bytes.Equal(s.g.key, key) {
			return s.g
		}
	}
}

// insert enters g, whose key (hash g.hash) is not in the table.
func (gt *gateTable) insert(g *gateEntry) {
	if 2*(gt.n+1) > len(gt.slots) {
		gt.resize(max(gateTableMin, 2*len(gt.slots)))
	}
	gt.put(g)
	gt.n++
}

func (gt *gateTable) put(g *gateEntry) {
	mask := uint64(len(gt.slots) - 1)
	i := g.hash & mask
	for gt.slots[i].g != nil {
		i = (i + 1) & mask
	}
	gt.slots[i] = gateSlot{hash: g.hash, g: g}
}

// remove takes g out of the table. Later slots of its probe sequence move back into the hole
// (backward-shift deletion), so every key stays reachable from its home slot without
// tombstones.
func (gt *gateTable) remove(g *gateEntry) {
	mask := uint64(len(gt.slots) - 1)
	i := g.hash & mask
	for gt.slots[i].g != g {
		if gt.slots[i].g == nil {
			panic("scheduler: a gate entry to remove is not in the gate")
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; gt.slots[j].g != nil; j = (j + 1) & mask {
		// The slot at j may move to the hole at i unless its home slot lies cyclically in
		// (i, j]: then it would move before its home and be lost to a probe.
		if home := gt.slots[j].hash & mask; (j-home)&mask >= (j-i)&mask {
			gt.slots[i] = gt.slots[j]
			i = j
		}
	}
	gt.slots[i] = gateSlot{}
	gt.n--
	if len(gt.slots) > gateTableMin && 8*gt.n < len(gt.slots) {
		gt.resize(len(gt.slots) / 2) // a burst of busy keys (a drain, a skewed stream) is over
	}
}

func (gt *gateTable) resize(size int) {
	old := gt.slots
	gt.slots = make([]gateSlot, size)
	for _, s := range old {
		if s.g != nil {
			gt.put(s.g)
		}
	}
}
