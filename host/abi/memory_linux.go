package abi

import (
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/tetratelabs/wazero/experimental"
)

// Linear memory
//
// Without an allocator, wazero keeps a guest's linear memory in a Go slice and grows it with
// append. Each growth past the slice's capacity allocates a new buffer, 1.25x larger, and copies
// the old one into it; the old buffer stays in the Go heap until the collector runs, and the
// collector lets the heap reach twice what is live before it does. A guest growing to 256 MiB
// a megabyte at a time cost about 1 GB of RSS that way, and one growing to 1 GiB about 3.9 GB.
//
// mmapMemory instead reserves the guest's maximum up front as address space only (PROT_NONE,
// MAP_NORESERVE: no RSS and no commit charge), and each memory.grow makes the next pages
// readable and writable in place. Nothing is ever copied, the buffer never moves, the Go heap
// never holds guest memory, and a page costs RSS only once the guest touches it. Free unmaps
// the whole reservation when the instance's module is closed (by the engine's releaser, soon
// after the instance closes: release.go), which returns its pages then rather than at the next
// collection.
//
// INVARIANT: no slice of guest memory is used after its instance is closed. After Free the
// addresses are unmapped, and a stale slice would fault the process instead of keeping the
// memory alive as a Go-heap slice would. Every view the Instance hands out is documented as
// valid only until the next call on the instance (Key) or until the Handler method returns.

// newLinearMemory returns the allocator instances are created with.
func newLinearMemory(capBytes, maxBytes uint64) experimental.LinearMemory {
	return newLimitedMemory(capBytes, maxBytes, nil)
}

// newLimitedMemory is newLinearMemory whose growth stops at *limit pages when limit is set and
// not 0 (the engine's live memory limit).
func newLimitedMemory(capBytes, maxBytes uint64, limit *atomic.Uint32) experimental.LinearMemory {
	if maxBytes == 0 {
		return &heapMemory{limit: limit}
	}
	b, err := unix.Mmap(-1, 0, int(maxBytes), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		// Out of address space (ulimit -v): fall back to wazero's own growth on the Go heap,
		// which is slower and costs more at peak but still works.
		return &heapMemory{buf: make([]byte, 0, capBytes), limit: limit}
	}
	return &mmapMemory{res: b, limit: limit}
}

// overLimit reports whether size bytes exceed the live limit.
func overLimit(limit *atomic.Uint32, size uint64) bool {
	if limit == nil {
		return false
	}
	p := limit.Load()
	return p > 0 && size > uint64(p)<<16
}

// mmapMemory is a linear memory in a reserved mapping; see "Linear memory" above.
type mmapMemory struct {
	res       []byte // the whole reservation, max bytes
	committed uint64 // bytes made readable and writable, a prefix of res
	limit     *atomic.Uint32
}

// Reallocate implements experimental.LinearMemory. Sizes are multiples of the 64 KiB Wasm page,
// so every boundary is a host page boundary.
func (m *mmapMemory) Reallocate(size uint64) []byte {
	if m.res == nil || size > uint64(len(m.res)) {
		return nil
	}
	if size > m.committed && overLimit(m.limit, size) {
		return nil // memory.grow returns -1: the live limit is lower than the reservation
	}
	if size > m.committed {
		if err := unix.Mprotect(m.res[m.committed:size], unix.PROT_READ|unix.PROT_WRITE); err != nil {
			return nil // memory.grow returns -1
		}
		m.committed = size
	}
	return m.res[:size:size]
}

// Free implements experimental.LinearMemory.
func (m *mmapMemory) Free() {
	if m.res != nil {
		_ = unix.Munmap(m.res)
		m.res, m.committed = nil, 0
	}
}

// heapMemory is the fallback when no address space can be reserved: growth on the Go heap, as
// wazero does without an allocator.
type heapMemory struct {
	buf   []byte
	limit *atomic.Uint32
}

func (m *heapMemory) Reallocate(size uint64) []byte {
	if size > uint64(len(m.buf)) && overLimit(m.limit, size) {
		return nil
	}
	if size <= uint64(cap(m.buf)) {
		m.buf = m.buf[:size]
	} else {
		m.buf = append(m.buf[:cap(m.buf)], make([]byte, size-uint64(cap(m.buf)))...)[:size]
	}
	return m.buf
}

func (m *heapMemory) Free() { m.buf = nil }

// allocator returns the allocator in's linear memory is created with: growth stops at the
// engine's live memory limit. It records whether the memory ended up on the Go heap (the
// fallback), which the instance budget needs to know: heap growth during instantiation includes
// the memory only then.
func (in *Instance) allocator() experimental.MemoryAllocator {
	return experimental.MemoryAllocatorFunc(func(capBytes, maxBytes uint64) experimental.LinearMemory {
		lm := newLimitedMemory(capBytes, maxBytes, &in.m.e.liveMemPages)
		_, in.memOnHeap = lm.(*heapMemory)
		return lm
	})
}
