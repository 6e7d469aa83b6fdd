package state

import "github.com/clink-wasm/clink-wasm/host/state/internal/format"

// DefaultKeyGroups is the default number of key groups of an operator, the same default as
// Flink's maximum parallelism. It bounds the parallelism an operator can be rescaled to, and
// must stay fixed for the lifetime of the operator's state.
const DefaultKeyGroups = 128

// MaxKeyGroups bounds the number of key groups (key groups are stored as 16-bit numbers).
const MaxKeyGroups = format.MaxKeyGroups

// KeyGroupOf returns the key group of a record key: a stable 64-bit FNV-1a hash of the record key
// bytes, finalised with the splitmix64 mixer, modulo numKeyGroups. The function is part of the
// durable format (docs/state-format.md) and must never change: records must be routed to
// subtasks with the same function, so the subtask owning a key group owns its state.
func KeyGroupOf(record []byte, numKeyGroups int) int {
	return int(format.Hash64(record) % uint64(numKeyGroups))
}

// KeyGroupRange is the half-open range [Lo, Hi) of key groups owned by one subtask. Its methods
// are Contains(kg), Overlaps(o), Intersect(o), Empty() and String(); the type lives with the
// durable format, which records ranges in manifests.
type KeyGroupRange = format.KeyGroupRange

// KeyGroupRangeFor returns the key groups owned by subtask index of parallelism, in the same
// contiguous split Flink uses: subtask i owns [ceil(i*n/p), ceil((i+1)*n/p)).
func KeyGroupRangeFor(index, parallelism, numKeyGroups int) KeyGroupRange {
	lo := (index*numKeyGroups + parallelism - 1) / parallelism
	hi := ((index+1)*numKeyGroups + parallelism - 1) / parallelism
	return KeyGroupRange{Lo: lo, Hi: hi}
}
