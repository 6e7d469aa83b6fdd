package abi

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// importDef is one clink_v1 host function.
type importDef struct {
	name       string
	params     []api.ValueType
	results    []api.ValueType
	paramNames []string
	fn         api.GoFunc
}

// clinkImports is the whole clink_v1 import module (docs/abi.md, "Imports").
var clinkImports = []importDef{
	{"get_async", []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i32},
		[]string{"state", "key_ptr", "key_len", "buf_ptr", "buf_cap"}, hostGet},
	{"put", []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i32},
		[]string{"state", "key_ptr", "key_len", "val_ptr", "val_len"}, hostPut},
	{"delete", []api.ValueType{i32, i32, i32}, []api.ValueType{i32},
		[]string{"state", "key_ptr", "key_len"}, hostDelete},
	{"take_result", []api.ValueType{i32, i32}, []api.ValueType{i32},
		[]string{"buf_ptr", "buf_cap"}, hostTakeResult},
	{"emit", []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32},
		[]string{"key_ptr", "key_len", "val_ptr", "val_len"}, hostEmit},
	{"timer_register", []api.ValueType{i64}, []api.ValueType{i32}, []string{"timestamp"}, hostTimerRegister},
	{"timer_delete", []api.ValueType{i64}, []api.ValueType{i32}, []string{"timestamp"}, hostTimerDelete},
	{"processing_timer_register", []api.ValueType{i64}, []api.ValueType{i32}, []string{"timestamp"}, hostProcTimerRegister},
	{"processing_timer_delete", []api.ValueType{i64}, []api.ValueType{i32}, []string{"timestamp"}, hostProcTimerDelete},
	{"watermark", nil, []api.ValueType{i64}, nil, hostWatermark},
	{"processing_time", nil, []api.ValueType{i64}, nil, hostProcessingTime},
	{"log", []api.ValueType{i32, i32, i32}, nil, []string{"level", "msg_ptr", "msg_len"}, hostLog},
	{"lookup", []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i64},
		[]string{"endpoint", "req_ptr", "req_len", "buf_ptr", "buf_cap"}, hostLookup},
	{"set_resume_order", []api.ValueType{i64}, nil, []string{"order"}, hostSetResumeOrder},
	{"output_area", []api.ValueType{i32, i32}, []api.ValueType{i32}, []string{"ptr", "cap"}, hostOutputArea},
	{"flush_output", nil, []api.ValueType{i32}, nil, hostFlushOutput},
}

var importByName = func() map[string]*importDef {
	m := make(map[string]*importDef, len(clinkImports))
	for i := range clinkImports {
		m[clinkImports[i].name] = &clinkImports[i]
	}
	return m
}()

// ImportNames lists the clink_v1 imports, in documentation order.
func ImportNames() []string {
	names := make([]string, len(clinkImports))
	for i, d := range clinkImports {
		names[i] = d.name
	}
	return names
}

// The capability each import needs from the current call (docs/abi.md, exports table).
type capability uint8

const (
	capKeyed  capability = iota // state and timers: clink_process, clink_on_timer
	capEmit                     // clink_process, clink_on_timer, clink_close
	capLookup                   // everything but clink_manifest, clink_key, clink_input
)

func (in *Instance) allowed(c capability) bool {
	switch in.kind {
	case callProcess, callTimer, callProcTimer, callBatch:
		return true
	case callClose:
		return c != capKeyed
	case callOpen, callInit:
		return c == capLookup
	}
	return false
}

func instance(ctx context.Context) *Instance {
	if c, ok := ctx.(*instanceCtx); ok {
		if c.in.batch.on {
			c.in.syncBatch()
		}
		return c.in
	}
	in, _ := ctx.Value(instanceKey{}).(*Instance)
	if in == nil {
		panic(errors.New("clink: import called outside a clink instance"))
	}
	if in.batch.on {
		in.syncBatch()
	}
	return in
}

func i32result(c Code) uint64 { return uint64(uint32(int32(c))) }

// hostErr turns a Handler error into a result code, or aborts the guest call.
func hostErr(err error) uint64 {
	var c Code
	if errors.As(err, &c) {
		return i32result(c)
	}
	var he *HostError
	if errors.As(err, &he) {
		panic(he)
	}
	panic(&HostError{Err: err})
}

func hostGet(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	state, kp, kl, bp, bc := uint32(stack[0]), uint32(stack[1]), uint32(stack[2]), uint32(stack[3]), uint32(stack[4])
	stack[0] = in.get(state, kp, kl, bp, bc)
}

func (in *Instance) get(state, kp, kl, bp, bc uint32) uint64 {
	in.hasPending = false
	if !in.allowed(capKeyed) {
		return i32result(NotAllowed)
	}
	if int(state) >= len(in.m.Manifest.States) {
		return i32result(InvalidArgument)
	}
	if int(kl) > in.limits.MaxStateKey {
		return i32result(TooLarge)
	}
	key, ok := in.view(kp, kl)
	if !ok || !in.inBounds(bp, bc) {
		return i32result(OutOfBounds)
	}
	v, found, err := in.h.Get(state, key)
	if err != nil {
		return hostErr(err)
	}
	if !found {
		return i32result(NotFound)
	}
	if len(v) > math.MaxInt32 {
		panic(&HostError{Err: errors.New("state value larger than 2 GiB")})
	}
	return uint64(in.deliver(bp, bc, v))
}

// deliver answers an async import: the value goes into the guest's buffer (bp, bc) when it
// fits, and otherwise becomes the pending result for take_result. It returns the value's
// length, which the guest compares with its buffer's capacity.
func (in *Instance) deliver(bp, bc uint32, v []byte) uint32 {
	n := uint32(len(v))
	if n <= bc {
		in.mem.Write(bp, v)
	} else {
		in.pending = append(in.pending[:0], v...)
		in.hasPending = true
	}
	return n
}

func hostPut(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	state, kp, kl, vp, vl := uint32(stack[0]), uint32(stack[1]), uint32(stack[2]), uint32(stack[3]), uint32(stack[4])
	stack[0] = in.put(state, kp, kl, vp, vl)
}

func (in *Instance) put(state, kp, kl, vp, vl uint32) uint64 {
	if !in.allowed(capKeyed) {
		return i32result(NotAllowed)
	}
	if int(state) >= len(in.m.Manifest.States) {
		return i32result(InvalidArgument)
	}
	if int(kl) > in.limits.MaxStateKey || int(vl) > in.limits.MaxStateValue {
		return i32result(TooLarge)
	}
	key, ok1 := in.view(kp, kl)
	val, ok2 := in.view(vp, vl)
	if !ok1 || !ok2 {
		return i32result(OutOfBounds)
	}
	if val == nil {
		val = []byte{}
	}
	if err := in.h.Put(state, key, val); err != nil {
		return hostErr(err)
	}
	return 0
}

func hostDelete(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	state, kp, kl := uint32(stack[0]), uint32(stack[1]), uint32(stack[2])
	stack[0] = in.delete(state, kp, kl)
}

func (in *Instance) delete(state, kp, kl uint32) uint64 {
	if !in.allowed(capKeyed) {
		return i32result(NotAllowed)
	}
	if int(state) >= len(in.m.Manifest.States) {
		return i32result(InvalidArgument)
	}
	if int(kl) > in.limits.MaxStateKey {
		return i32result(TooLarge)
	}
	key, ok := in.view(kp, kl)
	if !ok {
		return i32result(OutOfBounds)
	}
	if err := in.h.Delete(state, key); err != nil {
		return hostErr(err)
	}
	return 0
}

func hostTakeResult(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	stack[0] = in.takeResult(uint32(stack[0]), uint32(stack[1]))
}

func (in *Instance) takeResult(bp, bc uint32) uint64 {
	if !in.hasPending {
		return i32result(NoResult)
	}
	n := uint32(len(in.pending))
	if bc < n {
		return i32result(BufferTooSmall)
	}
	if !in.inBounds(bp, n) {
		return i32result(OutOfBounds)
	}
	in.mem.Write(bp, in.pending)
	in.hasPending = false
	return uint64(n)
}

func hostEmit(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	kp, kl, vp, vl := uint32(stack[0]), uint32(stack[1]), uint32(stack[2]), uint32(stack[3])
	stack[0] = in.emit(kp, kl, vp, vl)
}

func (in *Instance) emit(kp, kl, vp, vl uint32) uint64 {
	if !in.allowed(capEmit) {
		return i32result(NotAllowed)
	}
	if int(kl) > in.limits.MaxRecordKey || int(vl) > in.limits.MaxEmitValue || in.emits >= in.limits.MaxEmitsPerCall {
		return i32result(TooLarge)
	}
	key, ok1 := in.view(kp, kl)
	val, ok2 := in.view(vp, vl)
	if !ok1 || !ok2 {
		return i32result(OutOfBounds)
	}
	if in.batch.on && in.batch.drained < in.batch.cur && in.outCap != 0 {
		// The earlier records of the batch are complete: their output-area records go out
		// first, so that outputs leave in the order the records ran.
		if err := in.drainBatch(in.batch.cur, -1); err != nil {
			panic(err)
		}
	}
	if err := in.h.Emit(key, val); err != nil {
		return hostErr(err)
	}
	in.emits++
	return 0
}

func hostTimerRegister(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	stack[0] = in.timer(int64(stack[0]), true)
}

func hostTimerDelete(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	stack[0] = in.timer(int64(stack[0]), false)
}

func (in *Instance) timer(ts int64, register bool) uint64 {
	if !in.allowed(capKeyed) || (register && !in.m.hasOnTimer) {
		return i32result(NotAllowed)
	}
	var err error
	if register {
		err = in.h.RegisterTimer(ts)
	} else {
		err = in.h.DeleteTimer(ts)
	}
	if err != nil {
		return hostErr(err)
	}
	return 0
}

func hostProcTimerRegister(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	stack[0] = in.procTimer(int64(stack[0]), true)
}

func hostProcTimerDelete(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	stack[0] = in.procTimer(int64(stack[0]), false)
}

// procTimer serves processing_timer_register/delete. A Handler that does not implement
// ProcessingTimerHandler (an embedder that never fires them) answers NOT_ALLOWED.
func (in *Instance) procTimer(ts int64, register bool) uint64 {
	ph, ok := in.h.(ProcessingTimerHandler)
	if !in.allowed(capKeyed) || !ok || (register && !in.m.hasOnProcTimer) {
		return i32result(NotAllowed)
	}
	var err error
	if register {
		err = ph.RegisterProcessingTimer(ts)
	} else {
		err = ph.DeleteProcessingTimer(ts)
	}
	if err != nil {
		return hostErr(err)
	}
	return 0
}

func hostWatermark(ctx context.Context, stack []uint64) {
	stack[0] = uint64(instance(ctx).h.Watermark())
}

func hostProcessingTime(_ context.Context, stack []uint64) {
	stack[0] = uint64(time.Now().UnixMilli())
}

func hostLog(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	level, mp, ml := LogLevel(int32(uint32(stack[0]))), uint32(stack[1]), uint32(stack[2])
	if uint64(ml) > uint64(in.limits.MaxLogMessage) {
		ml = uint32(in.limits.MaxLogMessage)
	}
	msg, ok := in.view(mp, ml)
	if !ok {
		return // nothing to report the error to (docs/abi.md, log)
	}
	in.log(level, msg)
}

func hostLookup(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	ep, rp, rl, bp, bc := uint32(stack[0]), uint32(stack[1]), uint32(stack[2]), uint32(stack[3]), uint32(stack[4])
	stack[0] = in.lookup(ep, rp, rl, bp, bc)
}

func i64code(c Code) uint64 { return uint64(int64(c)) }

func (in *Instance) lookup(ep, rp, rl, bp, bc uint32) uint64 {
	in.hasPending = false
	if !in.allowed(capLookup) {
		return i64code(NotAllowed)
	}
	if int(ep) >= len(in.m.Manifest.Endpoints) {
		return i64code(InvalidArgument)
	}
	if int(rl) > in.limits.MaxLookupRequest {
		return i64code(TooLarge)
	}
	req, ok := in.view(rp, rl)
	if !ok || !in.inBounds(bp, bc) {
		return i64code(OutOfBounds)
	}
	status, body, err := in.h.Lookup(ep, req)
	if err != nil {
		var c Code
		if errors.As(err, &c) {
			return i64code(c)
		}
		hostErr(err) // panics
	}
	if status <= 0 || status > 999 {
		panic(&HostError{Err: errors.New("lookup handler returned an invalid status")})
	}
	if len(body) > math.MaxInt32 {
		return i64code(LookupResponseTooLarge)
	}
	return uint64(status)<<32 | uint64(in.deliver(bp, bc, body))
}

func hostSetResumeOrder(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	if in.allowed(capKeyed) {
		in.h.SetResumeOrder(int64(stack[0]))
	}
}

func hostOutputArea(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	stack[0] = in.outputArea(uint32(stack[0]), uint32(stack[1]))
}

func hostFlushOutput(ctx context.Context, stack []uint64) {
	stack[0] = instance(ctx).flushOutput()
}
