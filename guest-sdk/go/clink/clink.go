package clink

import (
	"errors"
	"runtime"
	"strconv"
	"unsafe"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"
)

// ABIVersion is the guest ABI version this SDK targets.
const ABIVersion = abi.Version

// Record is one input record. Key and Value point into the host's input buffer: they are valid
// until the call returns and must be copied to be kept. The SDK reuses one Record for every
// call, so do not keep the pointer either.
type Record struct {
	Key       []byte
	Value     []byte
	Timestamp int64 // event time, ms since the Unix epoch
}

// Operator processes records. A returned error fails the record: the SDK logs it at error
// level and the host fails the pipeline with it (docs/abi.md, "Faults").
//
// An Operator may also implement TimerHandler, Opener and Closer.
type Operator interface {
	Process(r *Record) error
}

// TimerHandler is implemented by operators that register event-time timers. OnTimer runs in the
// context of the timer's key, like Process for a record of that key; key is valid until it
// returns.
type TimerHandler interface {
	OnTimer(key []byte, timestamp int64) error
}

// Opener is implemented by operators with per-instance setup. Open runs once per instance of
// the module, which is not once per pipeline: the host creates instances as load requires.
// State and timers are not available in Open.
type Opener interface {
	Open() error
}

// Closer is implemented by operators with per-instance teardown. Close may Emit (to flush a
// buffer); state and timers are not available.
type Closer interface {
	Close() error
}

// ProcessFunc adapts a function to the Operator interface.
type ProcessFunc func(r *Record) error

// Process calls f(r).
func (f ProcessFunc) Process(r *Record) error { return f(r) }

var (
	opName string
	op     Operator
	// processFn is op.Process: for a ProcessFunc the function itself, so that a record costs
	// one call instead of the interface's call to ProcessFunc.Process and its call to f (each
	// call that is not inlined costs tens of nanoseconds in Go's wasm code).
	processFn func(*Record) error
	sealed    bool // set when the manifest has been produced; declarations are closed

	stateNames    []string
	endpointNames []string

	manifest []byte
	rec      Record
)

// Register sets the module's operator and its name, which the host uses in logs, errors and
// metrics (1-64 characters of [A-Za-z0-9_.-]). Call it exactly once, from an init function.
func Register(name string, o Operator) {
	if sealed {
		panic("clink: Register called after initialisation")
	}
	if op != nil {
		panic("clink: Register called twice (first for " + strconv.Quote(opName) + ")")
	}
	if o == nil {
		panic("clink: Register with a nil Operator")
	}
	if !validName(name, 64) {
		panic("clink: invalid operator name " + strconv.Quote(name) + ": want 1-64 characters of [A-Za-z0-9_.-]")
	}
	opName, op = name, o
	if f, ok := o.(ProcessFunc); ok {
		processFn = f
	} else {
		processFn = o.Process
	}
}

// Name returns the registered operator name.
func Name() string { return opName }

func validName(s string, max int) bool {
	if len(s) < 1 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

func declare(kind string, list *[]string, name string, max int) int {
	if sealed {
		panic("clink: New" + kind + "(" + strconv.Quote(name) + ") after initialisation: declare it as a package-level variable")
	}
	if !validName(name, 128) {
		panic("clink: invalid " + kind + " name " + strconv.Quote(name) + ": want 1-128 characters of [A-Za-z0-9_.-]")
	}
	for _, n := range *list {
		if n == name {
			panic("clink: " + kind + " " + strconv.Quote(name) + " declared twice")
		}
	}
	if len(*list) == max {
		panic("clink: more than " + strconv.Itoa(max) + " " + kind + "s")
	}
	*list = append(*list, name)
	return len(*list) - 1
}

// buildManifest renders the manifest JSON (docs/abi.md, "Declaring the module") and closes
// declarations. Names are validated at declaration, so they need no escaping.
func buildManifest() []byte {
	if manifest != nil {
		return manifest
	}
	if op == nil {
		panic("clink: no operator registered: call clink.Register in an init function of package main")
	}
	sealed = true
	b := []byte(`{"abi":` + strconv.Itoa(ABIVersion) + `,"name":"` + opName + `","states":[`)
	b = appendNames(b, stateNames)
	if len(prefetched) > 0 {
		b = append(b, `],"prefetch":[`...)
		for i, st := range prefetched {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '"')
			b = append(b, st.name...)
			b = append(b, '"')
		}
	}
	b = append(b, `],"endpoints":[`...)
	b = appendNames(b, endpointNames)
	manifest = append(b, "]}"...)
	return manifest
}

func appendNames(b []byte, names []string) []byte {
	for i, n := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, n...)
		b = append(b, '"')
	}
	return b
}

func init() {
	abi.Exports = abi.Hooks{
		Process:      process,
		ProcessBatch: processBatch,
		OnTimer:      onTimer,
		Open:         open,
		Close:        closeOp,
		Manifest:     buildManifest,
		Reset:        func() { area, areaState = nil, 0 },
	}
}

// The dispatchers below are what the exports run. Each recovers a panic, logs it at error
// level and returns 1: a panic escaping a //go:wasmexport function would abort the instance
// with only a runtime trace on stderr. guard also ends the call for the fast paths: frames
// and the output area belong to the host again once the export returns.

func process(keyLen, valueLen uint32, timestamp int64) (rc int32) {
	defer guard(&rc)
	sealed = true
	in := abi.Input
	end := keyLen + valueLen
	// Capacities stop at the record: appending to Key or Value cannot overwrite the frames.
	rec.Key = in[:keyLen:keyLen]
	rec.Value = in[keyLen:end:end]
	rec.Timestamp = timestamp
	if len(prefetched) > 0 {
		if err := loadFrames(abi.Align8(end)); err != nil {
			return fail(err)
		}
	}
	emitting = true
	return fail(processFn(&rec))
}

// processBatch runs count records of distinct keys in one call (docs/abi.md, "Batch calls"):
// the operator still sees one Process per record, with the record's own frames, and the host
// attributes each record's imports, outputs and faults through the header's current word,
// which is set before the record starts. The loop stops at the first record that fails; a
// panic leaves current on the record that panicked.
func processBatch(count uint32) (rc int32) {
	defer guard(&rc)
	sealed = true
	in := abi.Input
	// One check for the header and every descriptor: the loop reads them unchecked.
	if uint64(abi.BatchHeader)+uint64(abi.BatchDesc)*uint64(count) > uint64(len(in)) {
		return fail(errors.New("clink: the batch's descriptors lie outside the input buffer"))
	}
	base := abi.At(in, 0)
	emitting = true
	for i := uint32(0); i < count; i++ {
		abi.Store32(unsafe.Add(base, abi.BatchCurrent), i)
		d := unsafe.Add(base, abi.BatchHeader+abi.BatchDesc*uintptr(i))
		off := abi.Load32(unsafe.Add(d, abi.DescOffset))
		keyLen, valueLen := abi.Load32(unsafe.Add(d, abi.DescKeyLen)), abi.Load32(unsafe.Add(d, abi.DescValueLen))
		// In int (64 bits in a wasm build): no sum overflows, and the compiler sees that the
		// slice expressions below are in bounds once this check passed.
		kStart, kEnd := int(off), int(off)+int(keyLen)
		end := kEnd + int(valueLen)
		if end > len(in) {
			return fail(errors.New("clink: a batch record lies outside the input buffer"))
		}
		// Capacities stop at the record: appending to Key or Value cannot overwrite the frames.
		rec.Key = in[kStart:kEnd:kEnd]
		rec.Value = in[kEnd:end:end]
		rec.Timestamp = int64(abi.Load64(unsafe.Add(d, abi.DescTS)))
		if len(prefetched) > 0 {
			if err := loadFrames(off + abi.Align8(keyLen+valueLen)); err != nil {
				return fail(err)
			}
		}
		if err := processFn(&rec); err != nil {
			r := fail(err)
			abi.Store32(unsafe.Add(d, abi.DescRC), uint32(r))
			return r
		}
		if areaState > 0 {
			abi.Store32(unsafe.Add(d, abi.DescOutEnd), abi.Load32(abi.At(area, 0)))
		}
	}
	return 0
}

func onTimer(keyLen uint32, timestamp int64) (rc int32) {
	defer guard(&rc)
	sealed = true
	th, ok := op.(TimerHandler)
	if !ok {
		return fail(errors.New("clink: a timer fired but operator " + strconv.Quote(opName) + " does not implement clink.TimerHandler"))
	}
	if len(prefetched) > 0 {
		if err := loadFrames(abi.Align8(keyLen)); err != nil {
			return fail(err)
		}
	}
	emitting = true
	return fail(th.OnTimer(abi.Input[:keyLen:keyLen], timestamp))
}

func open() (rc int32) {
	defer guard(&rc)
	sealed = true
	if o, ok := op.(Opener); ok {
		return fail(o.Open())
	}
	return 0
}

func closeOp() (rc int32) {
	defer guard(&rc)
	emitting = true
	if c, ok := op.(Closer); ok {
		return fail(c.Close())
	}
	return 0
}

func fail(err error) int32 {
	if err == nil {
		return 0
	}
	Log(LevelError, err.Error())
	return 1
}

func guard(rc *int32) {
	emitting = false
	if len(prefetched) > 0 {
		endFrames()
	}
	r := recover()
	if r == nil {
		return
	}
	var msg string
	switch v := r.(type) {
	case error:
		msg = v.Error()
	case string:
		msg = v
	case interface{ String() string }:
		msg = v.String()
	default:
		msg = "(a value that is neither an error nor a string)"
	}
	// The stack goes first so that the message, the last error-level line, is what the
	// host attaches to its fault report.
	stack := make([]byte, 8<<10)
	stack = stack[:runtime.Stack(stack, false)]
	Log(LevelError, "panic stack:\n"+string(stack))
	Log(LevelError, "panic: "+msg)
	*rc = 1
}
