//go:build !wasip1

package abi

import (
	"math"
	"unsafe"
)

// In a native build the imports are served by Host, a single-threaded in-memory host that
// follows docs/abi.md closely enough to unit-test operators (package clinktest drives it). It
// is not the production host: it has no limits, no suspension and no sandbox.

// Call says which export the native host is currently inside; imports check it the way the
// real host does (NOT_ALLOWED outside a key context, and so on).
type Call int

const (
	CallNone Call = iota
	CallManifest
	CallOpen
	CallClose
	CallProcess
	CallTimer
	CallKey
)

// Output is one emitted record.
type Output struct {
	Key, Value []byte
	Timestamp  int64
}

// LogLine is one log call.
type LogLine struct {
	Level int32
	Msg   string
}

// LookupFunc answers a lookup: status > 0 and a body, or code < 0 (a LOOKUP_* code).
type LookupFunc func(endpoint int, request []byte) (status int, body []byte, code int32)

// NativeHost is the state of the in-memory host.
type NativeHost struct {
	Call      Call
	Key       string // record key of the current call
	Timestamp int64  // timestamp of the current record or timer

	NumStates, NumEndpoints int
	State                   map[string][]map[string][]byte // record key -> state index -> entry -> value
	Timers                  map[string]map[int64]bool      // record key -> timestamps
	WatermarkValue          int64
	Outputs                 []Output
	Logs                    []LogLine
	Lookups                 LookupFunc
	ResumeOrder             int64 // last set_resume_order of the current call

	pending    []byte
	hasPending bool
}

// Host is the native host every import talks to.
var Host = NewNativeHost()

// NewNativeHost returns an empty host with the watermark at its initial value.
func NewNativeHost() *NativeHost {
	return &NativeHost{
		State:          map[string][]map[string][]byte{},
		Timers:         map[string]map[int64]bool{},
		WatermarkValue: math.MinInt64,
	}
}

func bytesAt(p unsafe.Pointer, n uint32) []byte {
	if n == 0 || p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(p), n)
}

func (h *NativeHost) keyed() bool { return h.Call == CallProcess || h.Call == CallTimer }

func (h *NativeHost) entries(state uint32) (map[string][]byte, int32) {
	if !h.keyed() {
		return nil, NotAllowed
	}
	if int(state) >= h.NumStates {
		return nil, InvalidArgument
	}
	s := h.State[h.Key]
	if s == nil {
		s = make([]map[string][]byte, h.NumStates)
		h.State[h.Key] = s
	}
	if s[state] == nil {
		s[state] = map[string][]byte{}
	}
	return s[state], 0
}

func (h *NativeHost) deliver(v []byte, bufPtr unsafe.Pointer, bufCap uint32) {
	h.pending, h.hasPending = nil, false
	if uint32(len(v)) <= bufCap {
		copy(bytesAt(bufPtr, bufCap), v)
		return
	}
	h.pending, h.hasPending = append([]byte(nil), v...), true
}

func GetAsync(state uint32, keyPtr unsafe.Pointer, keyLen uint32, bufPtr unsafe.Pointer, bufCap uint32) int32 {
	h := Host
	h.pending, h.hasPending = nil, false
	m, rc := h.entries(state)
	if rc != 0 {
		return rc
	}
	v, ok := m[string(bytesAt(keyPtr, keyLen))]
	if !ok {
		return NotFound
	}
	h.deliver(v, bufPtr, bufCap)
	return int32(len(v))
}

func Put(state uint32, keyPtr unsafe.Pointer, keyLen uint32, valPtr unsafe.Pointer, valLen uint32) int32 {
	m, rc := Host.entries(state)
	if rc != 0 {
		return rc
	}
	m[string(bytesAt(keyPtr, keyLen))] = append([]byte{}, bytesAt(valPtr, valLen)...)
	return 0
}

func Delete(state uint32, keyPtr unsafe.Pointer, keyLen uint32) int32 {
	m, rc := Host.entries(state)
	if rc != 0 {
		return rc
	}
	delete(m, string(bytesAt(keyPtr, keyLen)))
	return 0
}

func TakeResult(bufPtr unsafe.Pointer, bufCap uint32) int32 {
	h := Host
	if !h.hasPending {
		return NoResult
	}
	if uint32(len(h.pending)) > bufCap {
		return BufferTooSmall
	}
	n := copy(bytesAt(bufPtr, bufCap), h.pending)
	h.pending, h.hasPending = nil, false
	return int32(n)
}

func Emit(keyPtr unsafe.Pointer, keyLen uint32, valPtr unsafe.Pointer, valLen uint32) int32 {
	h := Host
	if h.Call != CallProcess && h.Call != CallTimer && h.Call != CallClose {
		return NotAllowed
	}
	h.Outputs = append(h.Outputs, Output{
		Key:       append([]byte{}, bytesAt(keyPtr, keyLen)...),
		Value:     append([]byte{}, bytesAt(valPtr, valLen)...),
		Timestamp: h.Timestamp,
	})
	return 0
}

func TimerRegister(timestamp int64) int32 {
	h := Host
	if !h.keyed() {
		return NotAllowed
	}
	t := h.Timers[h.Key]
	if t == nil {
		t = map[int64]bool{}
		h.Timers[h.Key] = t
	}
	t[timestamp] = true
	return 0
}

func TimerDelete(timestamp int64) int32 {
	h := Host
	if !h.keyed() {
		return NotAllowed
	}
	delete(h.Timers[h.Key], timestamp)
	return 0
}

func Watermark() int64 { return Host.WatermarkValue }

// ProcessingTime is fixed in the native host so that tests are deterministic; clinktest can
// change it.
var NativeProcessingTime int64

func ProcessingTime() int64 { return NativeProcessingTime }

func Log(level int32, msgPtr unsafe.Pointer, msgLen uint32) {
	if level < 0 || level > 3 {
		level = 3
	}
	Host.Logs = append(Host.Logs, LogLine{Level: level, Msg: string(bytesAt(msgPtr, msgLen))})
}

func Lookup(endpoint uint32, reqPtr unsafe.Pointer, reqLen uint32, bufPtr unsafe.Pointer, bufCap uint32) int64 {
	h := Host
	h.pending, h.hasPending = nil, false
	if h.Call == CallManifest || h.Call == CallKey {
		return NotAllowed
	}
	if int(endpoint) >= h.NumEndpoints {
		return InvalidArgument
	}
	if h.Lookups == nil {
		return LookupUnavailable
	}
	status, body, code := h.Lookups(int(endpoint), append([]byte{}, bytesAt(reqPtr, reqLen)...))
	if code < 0 {
		return int64(code)
	}
	h.deliver(body, bufPtr, bufCap)
	return int64(status)<<32 | int64(uint32(len(body)))
}

func SetResumeOrder(order int64) {
	if Host.keyed() {
		Host.ResumeOrder = order
	}
}
