// Package sdktest tests the guest SDKs and the example fixtures as built WebAssembly, through
// a minimal in-test implementation of guest ABI v1 on wazero (miniHost). It does not depend on
// the production host (host/abi), so an SDK regression shows up here, not as a host failure.
//
//	go test ./guest-sdk/sdktest                                # conformance + example outputs
//	go test ./guest-sdk/sdktest -run '^$' -bench Instance      # per-instance memory and time
//
// -short skips the Go modules, whose compilation dominates the run time.
package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// Result codes (docs/abi.md).
const (
	rcNotFound       = -1
	rcInvalidArg     = -2
	rcOutOfBounds    = -3
	rcNotAllowed     = -5
	rcNoResult       = -6
	rcBufferTooSmall = -7
	rcLookupTimeout  = -16
)

type call int

const (
	inNone call = iota
	inManifest
	inOpen
	inClose
	inProcess
	inTimer
)

type output struct {
	key, value string
}

type logLine struct {
	level int32
	msg   string
}

// miniHost serves the clink_v1 imports for one runtime. Tests drive one call at a time.
type miniHost struct {
	t testing.TB

	call      call
	key       string
	states    []string
	endpoints []string
	state     map[string][]byte         // record key \x00 state index \x00 entry -> value
	timers    map[string]map[int64]bool // record key -> timestamps
	watermark int64

	pending     []byte
	havePending bool

	order   int64 // last set_resume_order
	out     []output
	logs    []logLine
	lastErr string // last error-level log line of the current call
}

func (h *miniHost) skey(state uint32, entry []byte) string {
	return fmt.Sprintf("%s\x00%d\x00%s", h.key, state, entry)
}

func (h *miniHost) keyed() bool { return h.call == inProcess || h.call == inTimer }

func (h *miniHost) deliver(m api.Module, v []byte, p, c uint32) {
	if uint32(len(v)) <= c {
		m.Memory().Write(p, v)
		return
	}
	h.pending, h.havePending = bytes.Clone(v), true
}

// u32 reads an i32 argument. wazero leaves the upper 32 bits of an i32 stack slot undefined,
// so every i32 argument must be truncated before use.
func u32(v uint64) uint32 { return uint32(v) }

func newMiniHost(ctx context.Context, t testing.TB) (*miniHost, wazero.Runtime) {
	h := &miniHost{t: t, state: map[string][]byte{}, timers: map[string]map[int64]bool{}, watermark: math.MinInt64}
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
	t.Cleanup(func() { rt.Close(ctx) })
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	i32, i64 := api.ValueTypeI32, api.ValueTypeI64
	b := rt.NewHostModuleBuilder("clink_v1")
	fn := func(name string, params, results []api.ValueType, f func(m api.Module, s []uint64)) {
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, m api.Module, s []uint64) { f(m, s) }), params, results).Export(name)
	}
	ret := func(s []uint64, v int32) { s[0] = api.EncodeI32(v) }
	fn("get_async", []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i32}, func(m api.Module, s []uint64) {
		h.pending, h.havePending = nil, false
		switch {
		case !h.keyed():
			ret(s, rcNotAllowed)
			return
		case int(u32(s[0])) >= len(h.states):
			ret(s, rcInvalidArg)
			return
		}
		e, ok := m.Memory().Read(u32(s[1]), u32(s[2]))
		if !ok {
			ret(s, rcOutOfBounds)
			return
		}
		v, found := h.state[h.skey(u32(s[0]), e)]
		if !found {
			ret(s, rcNotFound)
			return
		}
		h.deliver(m, v, u32(s[3]), u32(s[4]))
		ret(s, int32(len(v)))
	})
	fn("put", []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i32}, func(m api.Module, s []uint64) {
		if !h.keyed() {
			ret(s, rcNotAllowed)
			return
		}
		e, ok1 := m.Memory().Read(u32(s[1]), u32(s[2]))
		v, ok2 := m.Memory().Read(u32(s[3]), u32(s[4]))
		if !ok1 || !ok2 {
			ret(s, rcOutOfBounds)
			return
		}
		h.state[h.skey(u32(s[0]), e)] = bytes.Clone(v)
		ret(s, 0)
	})
	fn("delete", []api.ValueType{i32, i32, i32}, []api.ValueType{i32}, func(m api.Module, s []uint64) {
		if !h.keyed() {
			ret(s, rcNotAllowed)
			return
		}
		e, _ := m.Memory().Read(u32(s[1]), u32(s[2]))
		delete(h.state, h.skey(u32(s[0]), e))
		ret(s, 0)
	})
	fn("take_result", []api.ValueType{i32, i32}, []api.ValueType{i32}, func(m api.Module, s []uint64) {
		switch {
		case !h.havePending:
			ret(s, rcNoResult)
		case uint32(len(h.pending)) > u32(s[1]):
			ret(s, rcBufferTooSmall)
		default:
			m.Memory().Write(u32(s[0]), h.pending)
			ret(s, int32(len(h.pending)))
			h.pending, h.havePending = nil, false
		}
	})
	fn("emit", []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}, func(m api.Module, s []uint64) {
		if !h.keyed() && h.call != inClose {
			ret(s, rcNotAllowed)
			return
		}
		k, ok1 := m.Memory().Read(u32(s[0]), u32(s[1]))
		v, ok2 := m.Memory().Read(u32(s[2]), u32(s[3]))
		if !ok1 || !ok2 {
			ret(s, rcOutOfBounds)
			return
		}
		if !json.Valid(v) || bytes.ContainsAny(v, "\n") {
			h.t.Errorf("emit: not one line of JSON: %q", v)
		}
		h.out = append(h.out, output{string(k), string(v)})
		ret(s, 0)
	})
	fn("timer_register", []api.ValueType{i64}, []api.ValueType{i32}, func(m api.Module, s []uint64) {
		if !h.keyed() {
			ret(s, rcNotAllowed)
			return
		}
		if h.timers[h.key] == nil {
			h.timers[h.key] = map[int64]bool{}
		}
		h.timers[h.key][int64(s[0])] = true
		ret(s, 0)
	})
	fn("timer_delete", []api.ValueType{i64}, []api.ValueType{i32}, func(m api.Module, s []uint64) {
		if !h.keyed() {
			ret(s, rcNotAllowed)
			return
		}
		delete(h.timers[h.key], int64(s[0]))
		ret(s, 0)
	})
	fn("watermark", nil, []api.ValueType{i64}, func(m api.Module, s []uint64) { s[0] = api.EncodeI64(h.watermark) })
	fn("set_resume_order", []api.ValueType{i64}, nil, func(m api.Module, s []uint64) {
		if h.keyed() {
			h.order = int64(s[0])
		}
	})
	fn("processing_time", nil, []api.ValueType{i64}, func(m api.Module, s []uint64) { s[0] = api.EncodeI64(1234) })
	fn("log", []api.ValueType{i32, i32, i32}, nil, func(m api.Module, s []uint64) {
		msg, _ := m.Memory().Read(u32(s[1]), u32(s[2]))
		level := int32(u32(s[0]))
		h.logs = append(h.logs, logLine{level, string(msg)})
		if level >= 3 || level < 0 {
			h.lastErr = string(msg)
		}
	})
	// lookup: endpoint "echo" answers 200 with the request text, except the path /slow, which
	// times out, and /status/N, which answers N with an empty body.
	fn("lookup", []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i64}, func(m api.Module, s []uint64) {
		h.pending, h.havePending = nil, false
		if h.call == inManifest {
			s[0] = api.EncodeI64(rcNotAllowed)
			return
		}
		if int(u32(s[0])) >= len(h.endpoints) {
			s[0] = api.EncodeI64(rcInvalidArg)
			return
		}
		req, ok := m.Memory().Read(u32(s[1]), u32(s[2]))
		if !ok {
			s[0] = api.EncodeI64(rcOutOfBounds)
			return
		}
		line, _, _ := strings.Cut(string(req), "\n")
		status, body := int64(200), bytes.Clone(req)
		switch {
		case line == "GET /slow":
			s[0] = api.EncodeI64(rcLookupTimeout)
			return
		case strings.HasPrefix(line, "GET /status/"):
			fmt.Sscan(strings.TrimPrefix(line, "GET /status/"), &status)
			body = nil
		}
		h.deliver(m, body, u32(s[3]), u32(s[4]))
		s[0] = api.EncodeI64(status<<32 | int64(len(body)))
	})
	if _, err := b.Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	return h, rt
}

func moduleConfig() wazero.ModuleConfig {
	// An anonymous name so that many instances of one module can coexist in a runtime.
	return wazero.NewModuleConfig().WithName("").WithStartFunctions("_initialize").WithStderr(os.Stderr)
}

// instance is one instantiated guest with the host it talks to.
type instance struct {
	t        testing.TB
	h        *miniHost
	runtime  wazero.Runtime
	compiled wazero.CompiledModule
	mod      api.Module
	inPtr    uint32
	inCap    uint32
	manifest struct {
		ABI       int      `json:"abi"`
		Name      string   `json:"name"`
		States    []string `json:"states"`
		Endpoints []string `json:"endpoints"`
	}
}

// load instantiates the module at path, reads its manifest and runs clink_open.
func load(t testing.TB, path string) *instance {
	t.Helper()
	ctx := context.Background()
	h, rt := newMiniHost(ctx, t)
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	compiled, err := rt.CompileModule(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	mod, err := rt.InstantiateModule(ctx, compiled, moduleConfig())
	if err != nil {
		t.Fatal(err)
	}
	in := &instance{t: t, h: h, runtime: rt, compiled: compiled, mod: mod}
	h.call = inManifest
	packed, err := in.invoke("clink_manifest")
	if err != nil {
		t.Fatal(err)
	}
	mb, ok := mod.Memory().Read(uint32(packed>>32), uint32(packed))
	if !ok {
		t.Fatalf("clink_manifest returned (ptr, len) outside memory")
	}
	if err := json.Unmarshal(mb, &in.manifest); err != nil || in.manifest.ABI != 1 {
		t.Fatalf("manifest %q: %v", mb, err)
	}
	h.states, h.endpoints = in.manifest.States, in.manifest.Endpoints
	h.call = inOpen
	if rc, err := in.invoke("clink_open"); err != nil || rc != 0 {
		t.Fatalf("clink_open = %d, %v (%s)", int32(rc), err, h.lastErr)
	}
	return in
}

func (in *instance) invoke(name string, args ...uint64) (uint64, error) {
	f := in.mod.ExportedFunction(name)
	if f == nil {
		return 0, fmt.Errorf("no export %s", name)
	}
	r, err := f.Call(context.Background(), args...)
	if err != nil {
		return 0, err
	}
	if len(r) == 0 {
		return 0, nil
	}
	return r[0], nil
}

// fault is a failed call: a non-zero return or a trap, with the guest's last error log line.
type fault struct {
	rc   int32
	trap error
	msg  string
}

func (f *fault) Error() string {
	if f.trap != nil {
		return fmt.Sprintf("trap: %v; guest said %q", f.trap, f.msg)
	}
	return fmt.Sprintf("returned %d; guest said %q", f.rc, f.msg)
}

func (in *instance) run(c call, key string, name string, args ...uint64) ([]output, error) {
	h := in.h
	h.call, h.key, h.out, h.lastErr = c, key, nil, ""
	h.pending, h.havePending = nil, false
	rc, err := in.invoke(name, args...)
	h.call = inNone
	out := h.out
	h.out = nil
	if err != nil {
		return out, &fault{trap: err, msg: h.lastErr}
	}
	if int32(rc) != 0 {
		return out, &fault{rc: int32(rc), msg: h.lastErr}
	}
	return out, nil
}

func (in *instance) write(data ...[]byte) {
	n := 0
	for _, d := range data {
		n += len(d)
	}
	if in.inPtr == 0 || uint32(n) > in.inCap {
		p, err := in.invoke("clink_input", uint64(n))
		if err != nil || p == 0 {
			in.t.Fatalf("clink_input(%d) = %d, %v", n, p, err)
		}
		in.inPtr, in.inCap = uint32(p), uint32(n)
	}
	off := in.inPtr
	for _, d := range data {
		in.mod.Memory().Write(off, d)
		off += uint32(len(d))
	}
}

// process runs one record.
func (in *instance) process(key, value string, ts int64) ([]output, error) {
	in.write([]byte(key), []byte(value))
	return in.run(inProcess, key, "clink_process", uint64(len(key)), uint64(len(value)), uint64(ts))
}

// advance moves the watermark and fires the due timers in (timestamp, key) order.
func (in *instance) advance(wm int64) ([]output, error) {
	h := in.h
	h.watermark = max(h.watermark, wm)
	type due struct {
		key string
		ts  int64
	}
	var fire []due
	for k, ts := range h.timers {
		for t := range ts {
			if t <= h.watermark {
				fire = append(fire, due{k, t})
			}
		}
	}
	slices.SortFunc(fire, func(a, b due) int {
		if a.ts != b.ts {
			return int(min(max(a.ts-b.ts, -1), 1))
		}
		return strings.Compare(a.key, b.key)
	})
	var out []output
	for _, d := range fire {
		delete(h.timers[d.key], d.ts)
		in.write([]byte(d.key))
		o, err := in.run(inTimer, d.key, "clink_on_timer", uint64(len(d.key)), uint64(d.ts))
		out = append(out, o...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// close runs clink_close.
func (in *instance) close() ([]output, error) {
	return in.run(inClose, "", "clink_close")
}
