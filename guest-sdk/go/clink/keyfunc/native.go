//go:build !wasip1

package keyfunc

import "github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"

// Key runs the installed key function over value the way the host would, for tests. ok is
// false when the function rejects the record, panics, or was never set.
func Key(value []byte) (key []byte, ok bool) {
	abi.GrowInput(uint32(len(value)))
	copy(abi.Input, value)
	return compute(uint32(len(value)))
}
