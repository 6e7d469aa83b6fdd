// Package abi implements the host side of the clink-wasm guest ABI, version 1, on wazero.
//
// docs/abi.md is the specification; this package is its implementation. It loads and checks
// operator modules ([Engine.Load]), instantiates them ([Module.Instantiate]) and serves their
// `clink_v1` imports by translating guest pointers into bounds-checked byte slices and calling a
// [Handler] that the scheduler supplies per instance.
//
// # Notes
//
//   - The hot path does not allocate: every export call goes through CallWithStack with a stack
//     owned by the instance, records are written into a guest-owned input buffer obtained once
//     through `clink_input`, and host functions are api.GoModuleFunc values that read their
//     arguments from the stack.
//   - Runaway guests are stopped without wazero's WithCloseOnContextDone, which costs a goroutine
//     per call and an exit to Go at every loop iteration (measured: +400 ns per call, 28x slower
//     loops). Instead each module is rewritten at load time (internal/wasmbin) to count down a
//     fuel global at function entries and loop headers; at zero it calls the host, which checks
//     the call's time budget and its context, and refills or aborts the call. A watchdog empties
//     the fuel of live instances periodically, so a check comes soon whatever the loops do. See
//     fuel.go.
//   - A Handler may block inside Get or Lookup: that is how a guest call suspends. The abi
//     package neither knows nor cares which goroutine resumes it.
//   - A module that exports clink_process_batch can take several records of distinct keys in
//     one call ([Instance.ProcessBatch], batch.go); the handler is then a [BatchHandler], told
//     which record each import belongs to.
package abi

import (
	"fmt"
	"math"
	"time"
)

// Version is the guest ABI version this package implements.
const Version = 1

// ImportModule is the module name guests import the ABI from.
const ImportModule = "clink_v1"

// Code is a result code returned to the guest by an import. Negative values are errors; see
// docs/abi.md, "Result codes". A Handler returns a Code as its error to hand that code to the
// guest; any other error aborts the guest call as a fault.
type Code int32

// Result codes from docs/abi.md.
const (
	OK                     Code = 0
	NotFound               Code = -1
	InvalidArgument        Code = -2
	OutOfBounds            Code = -3
	TooLarge               Code = -4
	NotAllowed             Code = -5
	NoResult               Code = -6
	BufferTooSmall         Code = -7
	LookupTimeout          Code = -16
	LookupBreakerOpen      Code = -17
	LookupResponseTooLarge Code = -18
	LookupRefused          Code = -19
	LookupUnavailable      Code = -20
	LookupCancelled        Code = -21
)

var codeNames = map[Code]string{
	OK: "OK", NotFound: "NOT_FOUND", InvalidArgument: "INVALID_ARGUMENT", OutOfBounds: "OUT_OF_BOUNDS",
	TooLarge: "TOO_LARGE", NotAllowed: "NOT_ALLOWED", NoResult: "NO_RESULT", BufferTooSmall: "BUFFER_TOO_SMALL",
	LookupTimeout: "LOOKUP_TIMEOUT", LookupBreakerOpen: "LOOKUP_BREAKER_OPEN",
	LookupResponseTooLarge: "LOOKUP_RESPONSE_TOO_LARGE", LookupRefused: "LOOKUP_REFUSED",
	LookupUnavailable: "LOOKUP_UNAVAILABLE", LookupCancelled: "LOOKUP_CANCELLED",
}

// String returns the code's name from docs/abi.md.
func (c Code) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return fmt.Sprintf("CODE(%d)", int32(c))
}

// Error implements error, so a Handler can return a Code.
func (c Code) Error() string { return "clink: " + c.String() }

// LogLevel is the level argument of the log import.
type LogLevel int32

// Log levels.
const (
	LevelDebug LogLevel = 0
	LevelInfo  LogLevel = 1
	LevelWarn  LogLevel = 2
	LevelError LogLevel = 3
)

func (l LogLevel) String() string {
	switch l {
	case LevelDebug:
		return "debug"
	case LevelInfo:
		return "info"
	case LevelWarn:
		return "warn"
	default:
		return "error"
	}
}

// Limits bounds what a guest can make the host do. The zero value of a field means its default.
type Limits struct {
	MaxRecordKey     int           // bytes; default 64 KiB
	MaxRecordValue   int           // bytes; default 16 MiB
	MaxStateKey      int           // bytes; default 64 KiB
	MaxStateValue    int           // bytes; default 16 MiB
	MaxEmitValue     int           // bytes; default 16 MiB
	MaxEmitsPerCall  int           // default 65536
	MaxLookupRequest int           // bytes; default 1 MiB
	MaxLogMessage    int           // bytes; default 16 KiB
	MaxPrefetchValue int           // bytes a prefetch frame carries; default 64 KiB
	MemoryPages      uint32        // 64 KiB pages per instance; default 4096 (256 MiB)
	CallTime         time.Duration // execution time per call, suspension excluded; default 10 s
}

// Default limits, from docs/abi.md.
const (
	DefaultMaxRecordKey     = 64 << 10
	DefaultMaxRecordValue   = 16 << 20
	DefaultMaxStateKey      = 64 << 10
	DefaultMaxStateValue    = 16 << 20
	DefaultMaxEmitValue     = 16 << 20
	DefaultMaxEmitsPerCall  = 65536
	DefaultMaxLookupRequest = 1 << 20
	DefaultMaxLogMessage    = 16 << 10
	DefaultMaxPrefetchValue = 64 << 10
	DefaultMemoryPages      = 4096
	DefaultCallTime         = 10 * time.Second
)

// withDefaults returns l with zero fields replaced by their defaults. It is the one place where
// limit defaults live.
func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
		// Lengths return to the guest as signed i32 (docs/abi.md, Limits).
		*v = min(*v, math.MaxInt32)
	}
	def(&l.MaxRecordKey, DefaultMaxRecordKey)
	def(&l.MaxRecordValue, DefaultMaxRecordValue)
	def(&l.MaxStateKey, DefaultMaxStateKey)
	def(&l.MaxStateValue, DefaultMaxStateValue)
	def(&l.MaxEmitValue, DefaultMaxEmitValue)
	def(&l.MaxEmitsPerCall, DefaultMaxEmitsPerCall)
	def(&l.MaxLookupRequest, DefaultMaxLookupRequest)
	def(&l.MaxLogMessage, DefaultMaxLogMessage)
	def(&l.MaxPrefetchValue, DefaultMaxPrefetchValue)
	if l.MemoryPages == 0 {
		l.MemoryPages = DefaultMemoryPages
	}
	if l.MemoryPages > 65536 {
		l.MemoryPages = 65536
	}
	if l.CallTime <= 0 {
		l.CallTime = DefaultCallTime
	}
	return l
}

// Handler serves the imports of one instance. The scheduler supplies one per instance and knows
// which record or timer the instance is running. Methods are called on the goroutine running the
// guest call, one at a time. A returned Code goes back to the guest as the import's result; any
// other error aborts the guest call and becomes the fault's cause.
//
// Get and Lookup may block: that is how a guest call suspends at an async import. Slices passed
// in alias guest memory and are valid only until the method returns; slices returned must stay
// valid until the next method call on the Handler.
// ProcessingTimerHandler is implemented by a Handler that serves processing-time timers
// (processing_timer_register and processing_timer_delete). It is separate from Handler so that
// embedders that never fire them need not change: without it the imports return NOT_ALLOWED.
type ProcessingTimerHandler interface {
	RegisterProcessingTimer(ts int64) error
	DeleteProcessingTimer(ts int64) error
}

type Handler interface {
	Get(state uint32, entry []byte) (value []byte, found bool, err error)
	Put(state uint32, entry, value []byte) error
	Delete(state uint32, entry []byte) error
	Emit(key, value []byte) error
	RegisterTimer(ts int64) error
	DeleteTimer(ts int64) error
	Watermark() int64
	// Lookup sends the raw ABI-framed request through endpoint. It returns the response status
	// and body, or a Lookup* Code as err.
	Lookup(endpoint uint32, request []byte) (status int, body []byte, err error)
	Log(level LogLevel, msg []byte)
	// SetResumeOrder sets the priority of the call's next async waits (lower resumes first).
	SetResumeOrder(order int64)
}
