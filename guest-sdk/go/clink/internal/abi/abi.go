// Package abi is the raw clink guest ABI v1 (docs/abi.md) as seen from Go: the clink_v1
// imports, the result codes, and the hooks through which the exported entry points reach the
// clink package.
//
// In a GOOS=wasip1 build the imports are //go:wasmimport functions. In any other build they
// are served by an in-memory host (host_native.go) so that operators can be unit-tested with
// the clinktest package and so that `go build ./...` / `go vet ./...` work on the developer's
// machine.
package abi

import "unsafe"

// Result codes (docs/abi.md, "Result codes").
const (
	NotFound        = -1
	InvalidArgument = -2
	OutOfBounds     = -3
	TooLarge        = -4
	NotAllowed      = -5
	NoResult        = -6
	BufferTooSmall  = -7

	LookupTimeout          = -16
	LookupBreakerOpen      = -17
	LookupResponseTooLarge = -18
	LookupRefused          = -19
	LookupUnavailable      = -20
	LookupCancelled        = -21
)

// Version is the ABI version this package speaks.
const Version = 1

// Fast paths (docs/abi.md, "Fast paths").
const (
	// FrameHeader is the size of a prefetch frame's header: u32 len, u32 cap, u32 flags,
	// u32 reserved.
	FrameHeader = 16
	// FrameAbsent is a frame's len when the entry is absent (and what the guest writes to
	// delete it).
	FrameAbsent = 0xFFFFFFFF
	// FrameTooLarge is a frame's len when the value exists but is too large to travel in the
	// frame: read it with get_async.
	FrameTooLarge = 0xFFFFFFFE
	// FrameDirty is the flags bit that makes the host write the frame back.
	FrameDirty = 1
	// FrameMinCap is the smallest value area the host reserves in a frame.
	FrameMinCap = 64
	// MaxPrefetch is the most states a manifest may prefetch.
	MaxPrefetch = 16
	// RecordHeader is the size of a record's header in the output area: u32 key_len,
	// u32 value_len.
	RecordHeader = 8
)

// Batch calls (docs/abi.md, "Batch calls"): clink_process_batch(count) finds a header of
// BatchHeader bytes (u32 count, u32 current) at the start of the input buffer, then count
// descriptors of BatchDesc bytes.
const (
	BatchHeader  = 16
	BatchDesc    = 32
	BatchCurrent = 4 // header offset of the u32 the guest sets to the record it is on
	DescOffset   = 0
	DescKeyLen   = 4
	DescValueLen = 8
	DescRC       = 12
	DescTS       = 16
	DescOutEnd   = 24
)

// The unchecked accessors below read and write guest memory through a pointer, with no bounds
// check: in a WebAssembly guest every check and every slice header costs instructions on
// the per-record path. WebAssembly memory is little-endian and allows unaligned access. The
// caller must have checked that [p, p+size) lies inside the object p points into.

// At returns the address of b[i]; the caller checked i <= len(b).
func At(b []byte, i uint32) unsafe.Pointer {
	return unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), i)
}

// Load32 reads the u32 at p.
func Load32(p unsafe.Pointer) uint32 { return *(*uint32)(p) }

// Load64 reads the u64 at p.
func Load64(p unsafe.Pointer) uint64 { return *(*uint64)(p) }

// Store32 writes v at p.
func Store32(p unsafe.Pointer, v uint32) { *(*uint32)(p) = v }

// Store64 writes v at p.
func Store64(p unsafe.Pointer, v uint64) { *(*uint64)(p) = v }

// Or32 sets the bits of v in the u32 at p.
func Or32(p unsafe.Pointer, v uint32) { *(*uint32)(p) |= v }

// Le64 reads a little-endian u64 at b[0:8].
func Le64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// Align8 rounds n up to a multiple of 8: where the first prefetch frame starts after the
// record in the input buffer.
func Align8(n uint32) uint32 { return (n + 7) &^ 7 }

// Le32 reads a little-endian u32 at b[0:4].
func Le32(b []byte) uint32 {
	_ = b[3]
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// PutLe32 writes v little-endian to b[0:4].
func PutLe32(b []byte, v uint32) {
	_ = b[3]
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

// Hooks are the guest's entry points, installed by package clink at init. The wasip1 exports
// and the native test host both call through them, so there is one implementation of each.
type Hooks struct {
	Process func(keyLen, valueLen uint32, timestamp int64) int32
	// ProcessBatch is clink_process_batch: count records in one call (docs/abi.md).
	ProcessBatch func(count uint32) int32
	OnTimer      func(keyLen uint32, timestamp int64) int32
	Open         func() int32
	Close        func() int32
	Manifest     func() []byte
	// Reset forgets what the guest registered with its host (the output area). Only the
	// native host calls it, when clinktest starts what is a new instance to the operator but
	// the same process to the SDK.
	Reset func()
}

// Exports is set once by package clink's init.
var Exports Hooks

// KeyFunc is the guest's key function, set by package clink/keyfunc. Nil when the operator
// has none.
var KeyFunc func(value []byte) (key []byte, ok bool)

// Input is the buffer handed to the host by clink_input. The host writes each record's key and
// value into it before calling clink_process. It is kept reachable here so the collector never
// frees memory the host may write to.
var Input []byte

// MaxInput bounds clink_input: a larger request returns 0 (the host reports out of memory)
// instead of letting the Go runtime abort on an impossible allocation.
const MaxInput = 1 << 30

// GrowInput implements clink_input: it returns a buffer of at least n bytes, reusing the
// current one when it is large enough.
func GrowInput(n uint32) unsafe.Pointer {
	if n > MaxInput {
		return nil
	}
	if n == 0 {
		n = 1
	}
	if int(n) > len(Input) {
		Input = make([]byte, n)
	}
	return unsafe.Pointer(unsafe.SliceData(Input))
}

// Ptr returns the address of b's first byte, or nil for an empty slice (the ABI allows any
// pointer with length 0).
func Ptr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(unsafe.SliceData(b))
}

// StrPtr is Ptr for strings.
func StrPtr(s string) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(unsafe.StringData(s))
}

// Spare returns the address and capacity of b's spare room past len(b).
func Spare(b []byte) (unsafe.Pointer, uint32) {
	n := cap(b) - len(b)
	if n == 0 {
		return nil, 0
	}
	return unsafe.Pointer(unsafe.SliceData(b[len(b):cap(b)])), uint32(n)
}
