//go:build !linux

package abi

import "github.com/tetratelabs/wazero/experimental"

// memoryAllocator is nil outside Linux: linear memory grows on the Go heap, as wazero does by
// default (see memory_linux.go for the cost of that).
var memoryAllocator experimental.MemoryAllocator

// memoryAllocator returns nil outside Linux; the live memory limit (SetLiveLimits) is then
// only reported, not enforced at memory.grow.
func (e *Engine) memoryAllocator() experimental.MemoryAllocator { return memoryAllocator }
