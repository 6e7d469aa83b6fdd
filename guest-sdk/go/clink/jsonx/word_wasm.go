//go:build wasm

package jsonx

import "unsafe"

// word returns s[i:i+8] as one 64-bit load (the caller checked i+8 <= len(s)). Byte order
// does not matter to needsEscape, and WebAssembly allows unaligned loads.
func word(s []byte, i int) uint64 {
	return *(*uint64)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(s)), i))
}
