package clink

import (
	"unsafe"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"
)

// The output area (docs/abi.md, "The output area"). Emit appends records to a buffer that is
// registered with the host once; the host drains it when Process, OnTimer or Close returns, so
// emitting makes no import call. When a record does not fit, the SDK calls flush_output and
// starts over in the empty area; a record larger than the whole area goes through the emit
// import, after a flush, so that records still leave in the order they were emitted.
//
// The area is a Go byte slice: the Go collector does not move objects, and the package-level
// variable keeps it reachable for as long as it is registered.

// areaSize is the output area's size. Go instances are ~2.8 MB of linear memory, so 64 KiB is
// cheap, and it holds the output of most calls without a flush.
const areaSize = 64 << 10

var (
	// area is the registered output area; area[0:4] is the host-visible u32 used.
	area []byte
	// areaState is 0 before the first Emit, 1 once the area is registered, and -1 when the host
	// refused it (Emit then uses the emit import only).
	areaState int8
	// emitting is true during Process, OnTimer and Close: the calls whose return drains the
	// area. Elsewhere Emit goes to the emit import, which answers NOT_ALLOWED, rather than
	// leave a record in the area for the next call's drain.
	emitting bool
)

// Emit emits an output record with the given key (may be empty) and value, stamped with the
// timestamp of the record or timer being processed. The SDK copies both before Emit returns.
// For JSON Lines output the value must be one JSON value without a newline, or the host fails
// the pipeline. Allowed in Process, OnTimer and Close.
//
// Records are buffered in the output area and delivered when the call returns, in order. The
// host checks them then: a record over the pipeline's emit limits (value size, records per call)
// fails the call instead of returning ErrTooLarge, except for a record larger than the area
// (64 KiB), which Emit passes to the emit import directly.
func Emit(key, value []byte) error {
	if emitting {
		if areaState == 0 {
			registerArea()
		}
		if areaState > 0 {
			need := abi.RecordHeader + uint64(len(key)) + uint64(len(value))
			used := abi.Load32(abi.At(area, 0)) // the area is areaSize bytes
			if 4+uint64(used)+need <= uint64(len(area)) {
				appendRecord(used, key, value)
				return nil
			}
			if used > 0 {
				if rc := abi.FlushOutput(); rc < 0 {
					return codeErr("emit: flush_output", int64(rc))
				}
			}
			if 4+need <= uint64(len(area)) {
				appendRecord(0, key, value)
				return nil
			}
			// Larger than the area: the area is empty now, so the emit import keeps the order.
		}
	}
	if rc := abi.Emit(abi.Ptr(key), uint32(len(key)), abi.Ptr(value), uint32(len(value))); rc < 0 {
		return codeErr("emit", int64(rc))
	}
	return nil
}

// appendRecord writes key_len, value_len, key and value at offset 4+used of the area and
// publishes the new used. The caller checked that the record fits.
func appendRecord(used uint32, key, value []byte) {
	a := area[4+abi.RecordHeader+used:]
	n := copy(a, key)
	n += copy(a[n:], value)
	base := abi.At(area, 0)
	h := unsafe.Add(base, 4+used)
	abi.Store32(h, uint32(len(key)))
	abi.Store32(unsafe.Add(h, 4), uint32(len(value)))
	abi.Store32(base, used+abi.RecordHeader+uint32(n))
}

// registerArea allocates the area and registers it with the host, once per instance.
func registerArea() {
	a := make([]byte, areaSize)
	if rc := abi.OutputArea(abi.Ptr(a), uint32(len(a))); rc < 0 {
		areaState = -1
		return
	}
	area, areaState = a, 1
}
