//go:build wasip1

package clink

import (
	"unsafe"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"
)

// The guest ABI v1 exports (docs/abi.md, "Exports"). memory and _initialize come from the Go
// toolchain (-buildmode=c-shared). clink_key is exported only by operators that import package
// clink/keyfunc.

//go:wasmexport clink_input
func clinkInput(capacity uint32) unsafe.Pointer { return abi.GrowInput(capacity) }

//go:wasmexport clink_process
func clinkProcess(keyLen, valueLen uint32, timestamp int64) int32 {
	return process(keyLen, valueLen, timestamp)
}

//go:wasmexport clink_process_batch
func clinkProcessBatch(count uint32) int32 { return processBatch(count) }

//go:wasmexport clink_on_timer
func clinkOnTimer(keyLen uint32, timestamp int64) int32 { return onTimer(keyLen, timestamp) }

//go:wasmexport clink_open
func clinkOpen() int32 { return open() }

//go:wasmexport clink_close
func clinkClose() int32 { return closeOp() }

//go:wasmexport clink_manifest
func clinkManifest() uint64 {
	m := buildManifest()
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(m))))<<32 | uint64(len(m))
}
