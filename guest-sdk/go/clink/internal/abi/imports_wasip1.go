//go:build wasip1

package abi

import "unsafe"

// The clink_v1 imports (docs/abi.md, "Imports"). Pointers are passed as unsafe.Pointer so the
// compiler keeps the referenced memory alive across the call; lengths are unsigned.

//go:wasmimport clink_v1 get_async
//go:noescape
func GetAsync(state uint32, keyPtr unsafe.Pointer, keyLen uint32, bufPtr unsafe.Pointer, bufCap uint32) int32

//go:wasmimport clink_v1 put
//go:noescape
func Put(state uint32, keyPtr unsafe.Pointer, keyLen uint32, valPtr unsafe.Pointer, valLen uint32) int32

//go:wasmimport clink_v1 delete
//go:noescape
func Delete(state uint32, keyPtr unsafe.Pointer, keyLen uint32) int32

//go:wasmimport clink_v1 take_result
//go:noescape
func TakeResult(bufPtr unsafe.Pointer, bufCap uint32) int32

//go:wasmimport clink_v1 emit
//go:noescape
func Emit(keyPtr unsafe.Pointer, keyLen uint32, valPtr unsafe.Pointer, valLen uint32) int32

//go:wasmimport clink_v1 timer_register
func TimerRegister(timestamp int64) int32

//go:wasmimport clink_v1 timer_delete
func TimerDelete(timestamp int64) int32

//go:wasmimport clink_v1 watermark
func Watermark() int64

//go:wasmimport clink_v1 processing_time
func ProcessingTime() int64

//go:wasmimport clink_v1 log
//go:noescape
func Log(level int32, msgPtr unsafe.Pointer, msgLen uint32)

//go:wasmimport clink_v1 lookup
//go:noescape
func Lookup(endpoint uint32, reqPtr unsafe.Pointer, reqLen uint32, bufPtr unsafe.Pointer, bufCap uint32) int64

//go:wasmimport clink_v1 set_resume_order
func SetResumeOrder(order int64)

// output_area keeps the pointer after it returns (docs/abi.md, "The output area"): the caller
// keeps the buffer reachable for as long as it is registered, so it is not //go:noescape.
//
//go:wasmimport clink_v1 output_area
func OutputArea(ptr unsafe.Pointer, capacity uint32) int32

//go:wasmimport clink_v1 flush_output
func FlushOutput() int32
