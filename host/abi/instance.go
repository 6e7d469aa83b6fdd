package abi

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"math"
	"time"
	"unicode/utf8"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/clink-wasm/clink-wasm/internal/wasmbin"
)

const (
	minWatermark = math.MinInt64
	minInputCap  = 4096
)

// callKind is the export an instance is currently running; it decides which imports are allowed.
type callKind uint8

const (
	callNone callKind = iota
	callInit          // _initialize, during instantiation
	callManifest
	callInput
	callKey
	callOpen
	callProcess
	callTimer
	callClose
	callProcTimer // clink_on_processing_timer: the permissions of callTimer
	callMigrate   // clink_migrate (migrate.go): the permissions of callKey
	callBatch     // clink_process_batch (batch.go): the permissions of callProcess
)

var callExport = [...]string{
	callNone: "", callInit: ExportInitialize, callManifest: ExportManifest, callInput: ExportInput,
	callKey: ExportKey, callOpen: ExportOpen, callProcess: ExportProcess, callTimer: ExportOnTimer,
	callClose: ExportClose, callProcTimer: ExportOnProcessingTimer, callMigrate: ExportMigrate,
	callBatch: ExportProcessBatch,
}

// instanceCtx is the context every call of an instance runs with: its parent context plus the
// instance itself. Host functions find their Instance with one type assertion on the context
// wazero hands them (ctx.Value would walk a chain), and no call allocates.
type instanceCtx struct {
	context.Context
	in *Instance
	// The last other key asked for, and its value. wazero asks for one key on every call (its
	// snapshotter's), and in a pipeline the parent is a chain of contexts that Value walks to
	// the end each time. A context's values never change, so the walk is made once per key in
	// a row. Like the Instance, the context is used by one goroutine at a time.
	lastKey, lastVal any
	hasLast          bool
}

// instanceKey is the context key under which host functions find their Instance when a context
// wraps an instance context.
type instanceKey struct{}

func (c *instanceCtx) Value(key any) any {
	if key == (instanceKey{}) {
		return c.in
	}
	if c.hasLast && key == c.lastKey {
		return c.lastVal
	}
	v := c.Context.Value(key)
	c.lastKey, c.lastVal, c.hasLast = key, v, true
	return v
}

// Instance is one instantiation of a Module with the per-instance state the ABI needs: the input
// buffer, the pending result, and the current call. It is not safe for concurrent use, and is
// never re-entered: a call suspended in an async import keeps its instance until it returns.
type Instance struct {
	m   *Module
	mod api.Module
	mem api.Memory
	ctx context.Context
	// memOnHeap: the linear memory is a Go-heap slice (see MemoryOnHeap). Set while the
	// memory is created, during instantiation.
	memOnHeap bool
	h         Handler
	limits    *Limits

	// fnProcess is looked up at instantiation; the other exports when first called (export):
	// wazero gives every looked-up function its own 10 KiB call stack, and an SDK module
	// exports seven, of which a record needs one.
	fnProcess                                                 api.Function
	fnInput, fnTimer, fnProcTimer, fnClose, fnKey, fnManifest lazyExport
	fnBatch                                                   lazyExport
	stack                                                     []uint64

	inPtr, inCap uint32 // guest-owned input buffer from clink_input

	pf             prefetch   // frames of prefetched values (fastpath.go)
	batch          batchState // the current clink_process_batch call (batch.go)
	outPtr, outCap uint32     // the registered output area, if any (fastpath.go)

	kind       callKind
	emits      int
	pending    []byte // result waiting for take_result; reused
	hasPending bool
	lastError  []byte // last error-level log message of the current call
	stderr     lineWriter
	stdout     lineWriter

	// Time budget, see fuel.go. seq changes at the start of every call and whenever a call
	// resumes from a suspension; budgetSeq/budgetStart remember when the current run began.
	seq, budgetSeq uint64
	budgetStart    time.Duration
	lastCharge     time.Duration // when guest time was last charged to the engine's CPU share
	holdsSlot      bool          // the current call holds a running slot of the share (cpushare.go)
	refills        uint64        // fuel checks that reached the host, for measuring (BenchmarkFuelRefill)
	stopPoke       func() bool   // stops the context.AfterFunc that forces a check on cancellation

	broken bool // faulted: must not be called again
	closed bool
}

// Instantiate creates an instance whose imports are served by h, and runs its initialisation
// (`_initialize`, then `clink_open`). ctx is the instance's context for its whole life: when it
// is cancelled, a running call stops at its next fuel check with a cancellation fault.
func (m *Module) Instantiate(ctx context.Context, h Handler) (*Instance, error) {
	in, err := m.instantiate(ctx, h)
	if err != nil {
		return nil, err
	}
	if m.hasOpen {
		in.begin(callOpen)
		// Called once: not kept, so its call stack goes with it.
		err := in.mod.ExportedFunction(ExportOpen).CallWithStack(in.ctx, in.stack)
		if err = in.end(err); err != nil {
			in.discard(ctx)
			return nil, err
		}
	}
	// Emitting is not allowed before the first record: records left in the output area by
	// _initialize or clink_open would otherwise leave with the first record's output.
	if in.outCap != 0 {
		if used, _ := in.mem.ReadUint32Le(in.outPtr); used != 0 {
			err := in.abiFault(callOpen, "records were written to the output area during initialisation, where emitting is not allowed")
			in.discard(ctx)
			return nil, err
		}
	}
	return in, nil
}

func (m *Module) instantiate(ctx context.Context, h Handler) (*Instance, error) {
	lim := m.e.limits
	in := &Instance{m: m, h: h, limits: &lim, stack: make([]uint64, 4)}
	if n := len(m.prefetchIDs); n > 0 {
		in.pf = prefetch{ids: m.prefetchIDs, lens: make([]int64, n), caps: make([]uint32, n), at: make([]uint32, n)}
	}
	in.ctx = &instanceCtx{Context: ctx, in: in}
	in.stdout = lineWriter{in: in, level: LevelInfo}
	in.stderr = lineWriter{in: in, level: LevelError}
	cfg := wazero.NewModuleConfig().
		WithName(""). // anonymous: many instances of one module coexist in a runtime
		WithStartFunctions().
		WithStdin(bytes.NewReader(nil)).
		WithStdout(&in.stdout).
		WithStderr(&in.stderr).
		WithSysWalltime().
		WithSysNanotime().
		WithNanosleep(in.nanosleep).
		WithRandSource(rand.Reader).
		WithEnv("CLINK_OPERATOR", m.Manifest.Name)
	in.kind = callInit
	in.seq++
	in.lastCharge = monotonic() // the start function's time is charged too
	// The allocator is looked up in the context only while the memory is created.
	mod, err := m.e.rt.InstantiateModule(experimental.WithMemoryAllocator(in.ctx, in.allocator()), m.compiled, cfg)
	if err != nil {
		in.kind = callNone
		return nil, in.fault(callInit, err)
	}
	in.mod = mod
	if fuel, ok := mod.ExportedGlobal(wasmbin.FuelExportName).(api.MutableGlobal); ok {
		m.e.wd.add(in, fuel)
		in.stopPoke = context.AfterFunc(ctx, func() { m.e.wd.poke(in) })
	}
	in.mem = mod.Memory()
	if in.mem == nil {
		in.closeModule()
		return nil, &Fault{Operator: m.Manifest.Name, Export: "instantiate", Kind: FaultTrap, Err: errors.New("module has no memory")}
	}
	in.fnProcess = mod.ExportedFunction(ExportProcess)
	if m.hasInitialize {
		in.begin(callInit)
		err := mod.ExportedFunction(ExportInitialize).CallWithStack(in.ctx, in.stack)
		if err = in.end(err); err != nil {
			in.closeModule()
			return nil, err
		}
	}
	in.kind = callNone
	return in, nil
}

// lazyExport is an exported function looked up on first use (Instance.export).
type lazyExport struct {
	fn     api.Function // nil: the module does not export it
	looked bool
}

// export returns the function f names (nil if the module does not export it), looking it up
// the first time.
func (in *Instance) export(f *lazyExport, name string) api.Function {
	if !f.looked {
		f.fn, f.looked = in.mod.ExportedFunction(name), true
	}
	return f.fn
}

// Module returns the module the instance was created from.
func (in *Instance) Module() *Module { return in.m }

// Broken reports whether the instance faulted and must be discarded.
func (in *Instance) Broken() bool { return in.broken }

// NoteResumed tells the instance that its current call was suspended and has just resumed, so
// that the time spent suspended does not count against the call's time budget.
func (in *Instance) NoteResumed() {
	in.seq++
	if in.m.e.share != nil {
		in.enterShare()
		in.lastCharge = monotonic() // suspended time is not guest time
	}
}

// MemoryBytes returns the current size of the instance's linear memory.
func (in *Instance) MemoryBytes() uint64 { return uint64(in.mem.Size()) }

// MemoryOnHeap reports whether the instance's linear memory lives on the Go heap (grown by
// append, as wazero does by default) rather than in its own mapping (memory_linux.go). Only
// then does it show in the heap's growth, and carry append's spare capacity.
func (in *Instance) MemoryOnHeap() bool { return in.memOnHeap }

// Process delivers one record to clink_process. key and value are copied into guest memory,
// followed by the frames of the prefetched values; after a successful call the frames the guest
// wrote are applied and the output area is drained.
func (in *Instance) Process(key, value []byte, ts int64) error {
	base := len(key) + len(value)
	need := base
	if len(in.pf.ids) > 0 {
		var err error
		if need, err = in.gather(base); err != nil {
			return err
		}
	}
	if err := in.ensureInput(need); err != nil {
		return err
	}
	if len(in.pf.ids) > 0 {
		in.writeInput(need, key, value)
	} else {
		in.mem.Write(in.inPtr, key)
		in.mem.Write(in.inPtr+uint32(len(key)), value)
	}
	in.begin(callProcess)
	in.stack[0] = uint64(len(key))
	in.stack[1] = uint64(len(value))
	in.stack[2] = uint64(ts)
	if err := in.end(in.fnProcess.CallWithStack(in.ctx, in.stack)); err != nil {
		return err
	}
	return in.afterKeyed(callProcess)
}

// afterKeyed completes a successful clink_process or clink_on_timer: the output area, then the
// frame write-back, so that a call whose drain faults leaves no state written (docs/abi.md:
// frames are applied after everything else the call did, and only if it succeeded).
func (in *Instance) afterKeyed(k callKind) error {
	if err := in.drainOutput(k); err != nil {
		return err
	}
	if len(in.pf.ids) > 0 {
		return in.writeBack(k)
	}
	return nil
}

// OnTimer fires the event-time timer (key, ts) through clink_on_timer.
func (in *Instance) OnTimer(key []byte, ts int64) error {
	fn := in.export(&in.fnTimer, ExportOnTimer)
	if fn == nil {
		return &Fault{Operator: in.m.Manifest.Name, Export: ExportOnTimer, Kind: FaultTrap, Err: errors.New("a timer fired but the module does not export clink_on_timer")}
	}
	return in.fireTimer(fn, callTimer, key, ts)
}

// OnProcessingTimer fires the processing-time timer (key, ts) through
// clink_on_processing_timer. The call has the permissions of clink_on_timer.
func (in *Instance) OnProcessingTimer(key []byte, ts int64) error {
	fn := in.export(&in.fnProcTimer, ExportOnProcessingTimer)
	if fn == nil {
		return &Fault{Operator: in.m.Manifest.Name, Export: ExportOnProcessingTimer, Kind: FaultTrap, Err: errors.New("a processing-time timer fired but the module does not export clink_on_processing_timer")}
	}
	return in.fireTimer(fn, callProcTimer, key, ts)
}

func (in *Instance) fireTimer(fn api.Function, kind callKind, key []byte, ts int64) error {
	need := len(key)
	if len(in.pf.ids) > 0 {
		var err error
		if need, err = in.gather(len(key)); err != nil {
			return err
		}
	}
	if err := in.ensureInput(need); err != nil {
		return err
	}
	if len(in.pf.ids) > 0 {
		in.writeInput(need, key, nil)
	} else {
		in.mem.Write(in.inPtr, key)
	}
	in.begin(kind)
	in.stack[0] = uint64(len(key))
	in.stack[1] = uint64(ts)
	if err := in.end(fn.CallWithStack(in.ctx, in.stack)); err != nil {
		return err
	}
	return in.afterKeyed(kind)
}

// ErrKeyRejected is returned by Key when the guest's key function rejects a record.
var ErrKeyRejected = errors.New("the operator's key function rejected the record")

// Key runs the guest's key function on value. The returned key aliases guest memory and is valid
// until the next call on the instance.
func (in *Instance) Key(value []byte) ([]byte, error) {
	fnKey := in.export(&in.fnKey, ExportKey)
	if fnKey == nil {
		return nil, errors.New("module does not export clink_key")
	}
	if err := in.ensureInput(len(value)); err != nil {
		return nil, err
	}
	in.mem.Write(in.inPtr, value)
	in.begin(callKey)
	in.stack[0] = uint64(len(value))
	err := fnKey.CallWithStack(in.ctx, in.stack)
	ret := in.stack[0]
	in.leaveShare()
	in.kind = callNone
	in.hasPending = false
	if err != nil {
		in.broken = true
		return nil, in.fault(callKey, err)
	}
	if int64(ret) == -1 {
		return nil, ErrKeyRejected
	}
	ptr, n := uint32(ret>>32), uint32(ret)
	if int(n) > in.limits.MaxRecordKey {
		return nil, &Fault{Operator: in.m.Manifest.Name, Export: ExportKey, Kind: FaultTrap, Err: errors.New("key function returned a key over the key size limit")}
	}
	k, ok := in.view(ptr, n)
	if !ok {
		in.broken = true
		return nil, &Fault{Operator: in.m.Manifest.Name, Export: ExportKey, Kind: FaultTrap, Err: errors.New("key function returned a (ptr, len) outside memory")}
	}
	return k, nil
}

func (in *Instance) manifest() ([]byte, error) {
	fn := in.export(&in.fnManifest, ExportManifest)
	if fn == nil {
		return nil, errNoManifest
	}
	in.begin(callManifest)
	err := fn.CallWithStack(in.ctx, in.stack)
	ret := in.stack[0]
	in.leaveShare()
	in.kind = callNone
	if err != nil {
		in.broken = true
		return nil, in.fault(callManifest, err)
	}
	b, ok := in.view(uint32(ret>>32), uint32(ret))
	if !ok {
		return nil, errors.New("clink_manifest returned a (ptr, len) outside memory")
	}
	return b, nil
}

// Close retires the instance cleanly: it calls clink_close (whose emits are delivered) and
// releases the instance. A broken instance is released without calling into it.
func (in *Instance) Close(ctx context.Context) error {
	if in.closed {
		return nil
	}
	var err error
	if !in.broken {
		if fn := in.export(&in.fnClose, ExportClose); fn != nil {
			in.begin(callClose)
			if err = in.end(fn.CallWithStack(in.ctx, in.stack)); err == nil {
				err = in.drainOutput(callClose)
			}
		}
	}
	in.discard(ctx)
	return err
}

// discard releases the instance without calling into it.
func (in *Instance) discard(ctx context.Context) {
	if in.closed {
		return
	}
	in.closed = true
	in.broken = true
	if in.mod != nil {
		in.closeModule()
	}
}

// closeModule stops watching the instance and hands its module to the engine's releaser, which
// closes it soon (release.go).
func (in *Instance) closeModule() {
	in.m.e.wd.remove(in)
	if in.stopPoke != nil {
		in.stopPoke()
	}
	bytes := uint64(0)
	if in.mem != nil {
		bytes = uint64(in.mem.Size())
	}
	in.m.e.rel.release(in.mod, bytes)
}

// ensureInput makes the guest input buffer at least n bytes large.
func (in *Instance) ensureInput(n int) error {
	if in.broken {
		return &Fault{Operator: in.m.Manifest.Name, Kind: FaultTrap, Err: errors.New("instance is broken after an earlier fault")}
	}
	if uint32(n) <= in.inCap && n <= math.MaxUint32 {
		return nil
	}
	if n > math.MaxInt32 {
		return &Fault{Operator: in.m.Manifest.Name, Export: ExportInput, Kind: FaultOutOfMemory, Err: errors.New("record too large for a 32-bit guest")}
	}
	want := max(n, minInputCap, int(in.inCap)*2)
	if want > math.MaxInt32 {
		want = n
	}
	in.begin(callInput)
	in.stack[0] = uint64(want)
	err := in.export(&in.fnInput, ExportInput).CallWithStack(in.ctx, in.stack)
	ptr := uint32(in.stack[0])
	in.leaveShare()
	in.kind = callNone
	if err != nil {
		in.broken = true
		return in.fault(callInput, err)
	}
	if ptr == 0 {
		in.broken = true
		return &Fault{Operator: in.m.Manifest.Name, Export: ExportInput, Kind: FaultOutOfMemory,
			Err: errors.New("clink_input could not allocate the input buffer"), GuestMessage: in.guestMessage(), MemoryBytes: uint64(in.mem.Size())}
	}
	if uint64(ptr)+uint64(want) > uint64(in.mem.Size()) {
		in.broken = true
		return &Fault{Operator: in.m.Manifest.Name, Export: ExportInput, Kind: FaultTrap,
			Err: errors.New("clink_input returned a buffer outside memory")}
	}
	in.inPtr, in.inCap = ptr, uint32(want)
	return nil
}

func (in *Instance) begin(k callKind) {
	in.kind = k
	in.emits = 0
	in.lastError = in.lastError[:0]
	in.stderr.first = in.stderr.first[:0]
	in.seq++
	if in.m.e.share != nil {
		in.enterShare()
	}
}

// end finishes an export call that returns an i32 status.
func (in *Instance) end(err error) error {
	k := in.kind
	in.leaveShare()
	in.kind = callNone
	in.hasPending = false
	in.stdout.flush()
	in.stderr.flush()
	if err != nil {
		in.broken = true
		return in.fault(k, err)
	}
	if k == callInit {
		return nil
	}
	if rc := int32(uint32(in.stack[0])); rc != 0 {
		in.broken = true
		return &Fault{Operator: in.m.Manifest.Name, Export: callExport[k], Kind: FaultReturn, Code: rc, GuestMessage: in.guestMessage()}
	}
	return nil
}

// guestMessage is the guest's own account of a failure: its last error-level log message in the
// call, or else the first line it wrote to stderr (a Go panic message).
func (in *Instance) guestMessage() string {
	if len(in.lastError) > 0 {
		return string(in.lastError)
	}
	return string(in.stderr.first)
}

// view returns the guest bytes [ptr, ptr+n) without copying, or false if they are out of bounds.
// A zero-length view is always valid (docs/abi.md, "Conventions").
func (in *Instance) view(ptr, n uint32) ([]byte, bool) {
	if n == 0 {
		return nil, true
	}
	return in.mem.Read(ptr, n)
}

// inBounds reports whether [ptr, ptr+n) lies in guest memory.
func (in *Instance) inBounds(ptr, n uint32) bool {
	return n == 0 || uint64(ptr)+uint64(n) <= uint64(in.mem.Size())
}

func (in *Instance) log(level LogLevel, msg []byte) {
	if len(msg) > in.limits.MaxLogMessage {
		msg = msg[:in.limits.MaxLogMessage]
	}
	if !utf8.Valid(msg) {
		msg = bytes.ToValidUTF8(msg, []byte("\uFFFD"))
	}
	if level >= LevelError || level < LevelDebug {
		level = LevelError
		in.lastError = append(in.lastError[:0], msg...)
	}
	in.h.Log(level, msg)
}

// lineWriter turns a WASI stdout/stderr stream into log lines.
type lineWriter struct {
	in    *Instance
	level LogLevel
	buf   []byte
	first []byte // first complete line written during the current call (stderr only)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(w.buf)+len(p) > w.in.limits.MaxLogMessage {
				p = p[:max(0, w.in.limits.MaxLogMessage-len(w.buf))]
			}
			w.buf = append(w.buf, p...)
			break
		}
		w.buf = append(w.buf, p[:i]...)
		w.emit()
		p = p[i+1:]
	}
	return n, nil
}

func (w *lineWriter) flush() {
	if len(w.buf) > 0 {
		w.emit()
	}
}

func (w *lineWriter) emit() {
	line := w.buf
	if w.level == LevelError && len(w.first) == 0 && len(bytes.TrimSpace(line)) > 0 {
		w.first = append(w.first[:0], line...)
	}
	msg := line
	if len(msg) > w.in.limits.MaxLogMessage {
		msg = msg[:w.in.limits.MaxLogMessage]
	}
	if !utf8.Valid(msg) {
		msg = bytes.ToValidUTF8(msg, []byte("\uFFFD"))
	}
	w.in.h.Log(w.level, msg)
	w.buf = w.buf[:0]
}
