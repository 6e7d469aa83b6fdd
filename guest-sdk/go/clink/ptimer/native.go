//go:build !wasip1

package ptimer

import "github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"

// In a native build (tests, with clinktest) the native host serves the imports.

func register(timestamp int64) int32   { return abi.ProcTimerRegister(timestamp) }
func unregister(timestamp int64) int32 { return abi.ProcTimerDelete(timestamp) }

// Fire runs the operator's OnTimer for a processing-time timer whose key is in the input
// buffer (clinktest's AdvanceProcessingTime).
func Fire(keyLen uint32, timestamp int64) int32 {
	fired = true
	defer func() { fired = false }()
	return abi.Exports.OnTimer(keyLen, timestamp)
}
