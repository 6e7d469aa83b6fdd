//go:build !wasip1

package migrate

import "github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"

// Migrate runs the installed migration over one entry the way the host would, for tests:
// state is the index of the entry's state in the module's manifest. ok is false when the
// function dropped the entry; an error (or a panic) panics, as the call would trap.
func Migrate(state uint32, from int, key, entry, value []byte) (out []byte, ok bool) {
	abi.GrowInput(uint32(len(key) + len(entry) + len(value)))
	n := copy(abi.Input, key)
	n += copy(abi.Input[n:], entry)
	copy(abi.Input[n:], value)
	return compute(state, uint32(from), uint32(len(key)), uint32(len(entry)), uint32(len(value)))
}

// Versions returns what the module's clink_state_versions export returns.
func Versions() string { return string(versions) }
