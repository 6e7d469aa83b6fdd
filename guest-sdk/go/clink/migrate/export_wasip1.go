//go:build wasip1

package migrate

import (
	"unsafe"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"
)

// clinkMigrate returns packed (ptr, len) of the migrated value, or -1 to drop the entry.
//
//go:wasmexport clink_migrate
func clinkMigrate(state, from, keyLen, entryLen, valueLen uint32) int64 {
	out, ok := compute(state, from, keyLen, entryLen, valueLen)
	if !ok {
		return -1
	}
	return int64(uint64(uintptr(abi.Ptr(out)))<<32 | uint64(len(out)))
}

// clinkStateVersions returns packed (ptr, len) of {"state_version":N,"migrates_from":[...]}.
//
//go:wasmexport clink_state_versions
func clinkStateVersions() int64 {
	if versions == nil {
		panic("migrate: the module imports clink/migrate but never calls migrate.Set")
	}
	return int64(uint64(uintptr(unsafe.Pointer(unsafe.SliceData(versions))))<<32 | uint64(len(versions)))
}
