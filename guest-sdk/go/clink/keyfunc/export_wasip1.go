//go:build wasip1

package keyfunc

import (
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"
)

// clinkKey returns packed (ptr, len) of the key, or -1 to reject the record.
//
//go:wasmexport clink_key
func clinkKey(valueLen uint32) int64 {
	k, ok := compute(valueLen)
	if !ok {
		return -1
	}
	return int64(uint64(uintptr(abi.Ptr(k)))<<32 | uint64(len(k)))
}
