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

// Hooks are the guest's entry points, installed by package clink at init. The wasip1 exports
// and the native test host both call through them, so there is one implementation of each.
type Hooks struct {
	Process  func(keyLen, valueLen uint32, timestamp int64) int32
	OnTimer  func(keyLen uint32, timestamp int64) int32
	Open     func() int32
	Close    func() int32
	Manifest func() []byte
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

// Cap returns the address and capacity of b's spare room past len(b).
func Spare(b []byte) (unsafe.Pointer, uint32) {
	n := cap(b) - len(b)
	if n == 0 {
		return nil, 0
	}
	return unsafe.Pointer(unsafe.SliceData(b[len(b):cap(b)])), uint32(n)
}
