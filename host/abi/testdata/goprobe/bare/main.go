// bare is a probe guest for BenchmarkGoGuest: clink_process does nothing, without the SDK.
package main

import "unsafe"

var in = make([]byte, 1<<16)
var manifest = []byte(`{"abi":1,"name":"gonoop"}`)

//go:wasmexport clink_input
func clinkInput(n int32) int32 {
	if int(n) > len(in) {
		in = make([]byte, n)
	}
	return int32(uintptr(unsafe.Pointer(&in[0])))
}

//go:wasmexport clink_process
func clinkProcess(kl, vl int32, ts int64) int32 { return 0 }

//go:wasmexport clink_manifest
func clinkManifest() int64 {
	return int64(uintptr(unsafe.Pointer(&manifest[0])))<<32 | int64(len(manifest))
}

func main() {}
