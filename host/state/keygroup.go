package state

import "fmt"

// DefaultKeyGroups is the default number of key groups of an operator, the same default as
// Flink's maximum parallelism. It bounds the parallelism an operator can be rescaled to, and
// must stay fixed for the lifetime of the operator's state.
const DefaultKeyGroups = 128

// MaxKeyGroups bounds the number of key groups (key groups are stored as 16-bit numbers).
const MaxKeyGroups = 1 << 15

// KeyGroupOf returns the key group of a record key: a stable 64-bit FNV-1a hash of the record key
// bytes, finalised with the splitmix64 mixer, modulo numKeyGroups. The function is part of the
// durable format (docs/state-format.md) and must never change: records must be routed to
// subtasks with the same function, so the subtask owning a key group owns its state.
func KeyGroupOf(record []byte, numKeyGroups int) int {
	return int(hash64(record) % uint64(numKeyGroups))
}

// KeyGroupRange is the half-open range [Lo, Hi) of key groups owned by one subtask.
type KeyGroupRange struct{ Lo, Hi int }

// KeyGroupRangeFor returns the key groups owned by subtask index of parallelism, in the same
// contiguous split Flink uses: subtask i owns [ceil(i*n/p), ceil((i+1)*n/p)).
func KeyGroupRangeFor(index, parallelism, numKeyGroups int) KeyGroupRange {
	lo := (index*numKeyGroups + parallelism - 1) / parallelism
	hi := ((index+1)*numKeyGroups + parallelism - 1) / parallelism
	return KeyGroupRange{Lo: lo, Hi: hi}
}

// Contains reports whether kg is in r.
func (r KeyGroupRange) Contains(kg int) bool { return kg >= r.Lo && kg < r.Hi }

// Overlaps reports whether r and o share a key group.
func (r KeyGroupRange) Overlaps(o KeyGroupRange) bool { return r.Lo < o.Hi && o.Lo < r.Hi }

// Intersect returns the key groups in both r and o (empty when they do not overlap).
func (r KeyGroupRange) Intersect(o KeyGroupRange) KeyGroupRange {
	x := KeyGroupRange{Lo: max(r.Lo, o.Lo), Hi: min(r.Hi, o.Hi)}
	if x.Hi < x.Lo {
		x.Hi = x.Lo
	}
	return x
}

// Empty reports whether r holds no key group.
func (r KeyGroupRange) Empty() bool { return r.Hi <= r.Lo }

func (r KeyGroupRange) String() string { return fmt.Sprintf("[%d,%d)", r.Lo, r.Hi) }

// hash64 is FNV-1a 64 finalised with splitmix64. It is part of the durable format: key groups
// and bloom filters depend on it.
func hash64(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return mix64(h)
}

func mix64(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
