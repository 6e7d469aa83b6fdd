package format

import "fmt"

// MaxKeyGroups bounds the number of key groups (key groups are stored as 16-bit numbers).
const MaxKeyGroups = 1 << 15

// KeyGroupRange is the half-open range [Lo, Hi) of key groups owned by one subtask. The state
// package exports it as state.KeyGroupRange.
type KeyGroupRange struct{ Lo, Hi int }

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

// Hash64 is FNV-1a 64 finalised with splitmix64. It is part of the durable format: key groups
// (state.KeyGroupOf) and bloom filters depend on it, so it must never change.
func Hash64(b []byte) uint64 {
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
