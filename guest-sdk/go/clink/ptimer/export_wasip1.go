//go:build wasip1

package ptimer

import "github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"

//go:wasmexport clink_on_processing_timer
func clinkOnProcessingTimer(keyLen uint32, timestamp int64) int32 {
	return Fire(keyLen, timestamp)
}

//go:wasmimport clink_v1 processing_timer_register
func register(timestamp int64) int32

//go:wasmimport clink_v1 processing_timer_delete
func unregister(timestamp int64) int32

// Fire runs the operator's OnTimer for a processing-time timer whose key is in the input
// buffer.
func Fire(keyLen uint32, timestamp int64) int32 {
	fired = true
	defer func() { fired = false }()
	return abi.Exports.OnTimer(keyLen, timestamp)
}
