//go:build !linux

package abi

import "github.com/tetratelabs/wazero/experimental"

// allocator is nil outside Linux: linear memory grows on the Go heap, as wazero does by default
// (see memory_linux.go for the cost of that), and the live memory limit (SetLiveLimits) is then
// only reported, not enforced at memory.grow.
func (in *Instance) allocator() experimental.MemoryAllocator {
	in.memOnHeap = true
	return nil
}
