package abi

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// recHandler is a Handler that keeps state in a map (one record key at a time) and records
// everything else, for conformance tests.
type recHandler struct {
	state   map[string][]byte
	emits   [][2]string
	timers  map[int64]bool
	logs    []string
	wm      int64
	lookup  func(ep uint32, req []byte) (int, []byte, error)
	emitErr error
	getErr  error
	order   int64
}

func newRec() *recHandler {
	return &recHandler{state: map[string][]byte{}, timers: map[int64]bool{}, wm: math.MinInt64}
}

func sk(state uint32, entry []byte) string { return fmt.Sprintf("%d/%s", state, entry) }

func (h *recHandler) Get(state uint32, entry []byte) ([]byte, bool, error) {
	if h.getErr != nil {
		return nil, false, h.getErr
	}
	v, ok := h.state[sk(state, entry)]
	return v, ok, nil
}
func (h *recHandler) Put(state uint32, entry, value []byte) error {
	h.state[sk(state, entry)] = bytes.Clone(value)
	return nil
}
func (h *recHandler) Delete(state uint32, entry []byte) error {
	delete(h.state, sk(state, entry))
	return nil
}
func (h *recHandler) Emit(key, value []byte) error {
	if h.emitErr != nil {
		return h.emitErr
	}
	h.emits = append(h.emits, [2]string{string(key), string(value)})
	return nil
}
func (h *recHandler) RegisterTimer(ts int64) error { h.timers[ts] = true; return nil }
func (h *recHandler) DeleteTimer(ts int64) error   { delete(h.timers, ts); return nil }
func (h *recHandler) Watermark() int64             { return h.wm }
func (h *recHandler) Lookup(ep uint32, req []byte) (int, []byte, error) {
	if h.lookup == nil {
		return 0, nil, LookupUnavailable
	}
	return h.lookup(ep, req)
}
func (h *recHandler) SetResumeOrder(o int64) { h.order = o }
func (h *recHandler) Log(level LogLevel, msg []byte) {
	h.logs = append(h.logs, level.String()+": "+string(msg))
}

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newEngine(t testing.TB, lim Limits) *Engine {
	t.Helper()
	e, err := NewEngine(context.Background(), WithLimits(lim))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e
}

func load(t testing.TB, e *Engine, name string, endpoints ...string) *Module {
	t.Helper()
	var opts []LoadOption
	if endpoints != nil {
		opts = append(opts, WithEndpoints(endpoints...))
	}
	m, err := e.Load(context.Background(), fixture(t, name), opts...)
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return m
}

func TestLoadRefusesBadModules(t *testing.T) {
	e := newEngine(t, Limits{MemoryPages: 1024})
	ctx := context.Background()
	cases := []struct {
		name string
		bin  []byte
		want []string
	}{
		{"not wasm", []byte("hello, this is not wasm"), []string{"not a WebAssembly module"}},
		{"truncated", fixture(t, "counter")[:40], []string{"invalid WebAssembly module"}},
		{"component", []byte("\x00asm\x0d\x00\x01\x00"), []string{"binary version"}},
		{"abi v2 import", fixture(t, "abiv2"), []string{"targets clink ABI v2", "supports v1"}},
		{"abi v2 manifest", fixture(t, "manifestv2"), []string{"targets clink ABI v2"}},
		{"missing exports", fixture(t, "noexports"), []string{`missing export "memory"`, "missing export clink_input", "missing export clink_process"}},
		{"wrong signature", fixture(t, "badsig"), []string{"export clink_process has signature (i32, i32) -> (i32)", "(i32, i32, i64) -> (i32)"}},
		{"wasi command", fixture(t, "command"), []string{"WASI command"}},
		{"sockets", fixture(t, "sock"), []string{"sock_accept", "sockets are not available"}},
		{"foreign imports", fixture(t, "envimport"), []string{"env.abort, which the host does not provide", "clink_v1.teleport, which ABI v1 does not define"}},
		{"imported memory", fixture(t, "importmem"), []string{"imports memory env.memory"}},
		{"bad manifest", fixture(t, "badmanifest"), []string{`name "bad name!" is invalid`}},
		{"no manifest", fixture(t, "nomanifest"), []string{"no manifest"}},
		{"memory over limit", fixture(t, "bigmem"), []string{"min 5000 pages", "over limit of 1024 pages"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Load(ctx, tc.bin)
			var le *LoadError
			if !errors.As(err, &le) {
				t.Fatalf("want *LoadError, got %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestLoadChecksEndpoints(t *testing.T) {
	e := newEngine(t, Limits{})
	_, err := e.Load(context.Background(), fixture(t, "probe"), WithEndpoints("other"))
	if err == nil || !strings.Contains(err.Error(), `declares lookup endpoint "ep" but the pipeline defines no such endpoint`) {
		t.Fatalf("got %v", err)
	}
	if _, err := e.Load(context.Background(), fixture(t, "probe"), WithEndpoints("ep")); err != nil {
		t.Fatal(err)
	}
	// WithEndpoints with no names: the pipeline defines none, so a module declaring one is
	// refused; without the option endpoints are not checked at all.
	if _, err := e.Load(context.Background(), fixture(t, "probe"), WithEndpoints()); err == nil {
		t.Fatal("a module declaring an endpoint loaded into a pipeline that defines none")
	}
	if _, err := e.Load(context.Background(), fixture(t, "probe")); err != nil {
		t.Fatalf("without WithEndpoints: %v", err)
	}
	// Options apply in order: the last WithEndpoints wins, and the caller's slice is copied.
	names := []string{"ep"}
	opt := WithEndpoints(names...)
	names[0] = "other"
	if _, err := e.Load(context.Background(), fixture(t, "probe"), WithEndpoints("other"), opt); err != nil {
		t.Fatalf("last option, copied names: %v", err)
	}
}

func TestInspectReport(t *testing.T) {
	e := newEngine(t, Limits{})
	rep := e.Inspect(context.Background(), fixture(t, "probe"))
	if !rep.Usable() || rep.ABIVersion != 1 || rep.Manifest.Name != "probe" ||
		strings.Join(rep.Manifest.States, ",") != "s0,s1" || rep.ManifestSource != "custom section clink.manifest" {
		t.Fatalf("report: %+v", rep)
	}
	if len(rep.Imports) != 13 {
		t.Errorf("imports: %v (the instrumenter's fuel import must not be listed)", rep.Imports)
	}
	rep = e.Inspect(context.Background(), fixture(t, "counter"))
	if !rep.Usable() || rep.ManifestSource != "export clink_manifest" || rep.Manifest.Name != "counter" {
		t.Fatalf("report: %+v", rep)
	}
}

func TestCounter(t *testing.T) {
	e := newEngine(t, Limits{})
	m := load(t, e, "counter")
	h := newRec()
	in, err := m.Instantiate(context.Background(), h)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close(context.Background())
	for _, k := range []string{"a", "a", "a"} {
		if err := in.Process([]byte(k), []byte(`{}`), 1); err != nil {
			t.Fatal(err)
		}
	}
	got := fmt.Sprint(h.emits)
	want := `[[a {"count":1}] [a {"count":2}] [a {"count":3}]]`
	if got != want {
		t.Fatalf("emits %s, want %s", got, want)
	}
}

// op builds one probe script entry.
func op(code int64, args ...int64) []byte {
	b := make([]byte, 48)
	binary.LittleEndian.PutUint64(b, uint64(code))
	for i, a := range args {
		binary.LittleEndian.PutUint64(b[8*(i+1):], uint64(a))
	}
	return b
}

// Probe memory layout (testdata/probe.wat).
const (
	probeIn      = 65536
	probeResults = 98304
	probeData    = 1024 // a free area for test data
)

// runProbe runs a script on a fresh probe instance and returns each op's result.
func runProbe(t *testing.T, in *Instance, h *recHandler, key []byte, ops ...[]byte) []int64 {
	t.Helper()
	h.emits = nil
	if err := in.Process(key, bytes.Join(ops, nil), 5); err != nil {
		t.Fatalf("process: %v", err)
	}
	last := h.emits[len(h.emits)-1][1]
	res := make([]int64, len(last)/8)
	for i := range res {
		res[i] = int64(binary.LittleEndian.Uint64([]byte(last[8*i:])))
	}
	return res
}

func newProbe(t *testing.T, lim Limits) (*Instance, *recHandler) {
	t.Helper()
	e := newEngine(t, lim)
	m := load(t, e, "probe", "ep")
	h := newRec()
	in, err := m.Instantiate(context.Background(), h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(context.Background()) })
	return in, h
}

func (in *Instance) poke(t *testing.T, off uint32, b []byte) {
	t.Helper()
	if !in.mem.Write(off, b) {
		t.Fatal("poke out of bounds")
	}
}

func (in *Instance) peek(t *testing.T, off, n uint32) string {
	t.Helper()
	b, ok := in.mem.Read(off, n)
	if !ok {
		t.Fatal("peek out of bounds")
	}
	return string(b)
}

func TestImportStateConformance(t *testing.T) {
	in, h := newProbe(t, Limits{MaxStateKey: 16, MaxStateValue: 64})
	memSize := int64(in.mem.Size())
	in.poke(t, probeData, []byte("entryvalue-0123456789"))
	// entry "entry" at probeData (5 bytes), value "value-0123456789" at probeData+5 (16 bytes)
	const (
		ent  = probeData
		val  = probeData + 5
		buf  = 2048
		buf2 = 3072
	)
	res := runProbe(t, in, h, []byte("k"),
		op(0, 0, ent, 5, buf, 64),              // 0 get absent -> NOT_FOUND
		op(1, 0, ent, 5, val, 16),              // 1 put
		op(0, 0, ent, 5, buf, 64),              // 2 get -> 16, copied
		op(0, 0, ent, 5, buf2, 4),              // 3 get into small buffer -> 16, pending
		op(3, buf2, 8),                         // 4 take_result too small -> BUFFER_TOO_SMALL
		op(3, buf2, 16),                        // 5 take_result -> 16
		op(3, buf2, 16),                        // 6 take_result again -> NO_RESULT
		op(0, 7, ent, 5, buf, 64),              // 7 get unknown state -> INVALID_ARGUMENT
		op(0, 0, memSize-2, 5, buf, 64),        // 8 get key out of bounds -> OUT_OF_BOUNDS
		op(0, 0, ent, 5, memSize-8, 64),        // 9 get buffer out of bounds -> OUT_OF_BOUNDS
		op(0, 0, ent, 17, buf, 64),             // 10 key over limit -> TOO_LARGE
		op(1, 0, ent, 5, val, 65),              // 11 put value over limit -> TOO_LARGE
		op(1, 1, 0, 0, 0, 0),                   // 12 put empty entry, empty value in state 1
		op(0, 1, 0, 0, buf, 0),                 // 13 get it: found, 0 bytes
		op(2, 0, ent, 5),                       // 14 delete
		op(0, 0, ent, 5, buf, 64),              // 15 get -> NOT_FOUND
		op(2, 0, ent, 5),                       // 16 delete absent -> OK
		op(2, 0, memSize, 1),                   // 17 delete OOB -> OUT_OF_BOUNDS
		op(0, 0, 0xFFFFFFFF, 0, 0xFFFFFFFF, 0), // 18 zero-length at any pointer is valid -> NOT_FOUND
		op(1, 0, 0xFFFFFFFF, 0, 0x7FFFFFFF, 0), // 19 -> OK
	)
	want := []int64{-1, 0, 16, 16, -7, 16, -6, -2, -3, -3, -4, -4, 0, 0, 0, -1, 0, -3, -1, 0}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		t.Fatalf("results\n got %v\nwant %v", res, want)
	}
	if got := in.peek(t, buf, 16); got != "value-0123456789" {
		t.Errorf("get copied %q", got)
	}
	if got := in.peek(t, buf2, 16); got != "value-0123456789" {
		t.Errorf("take_result copied %q", got)
	}
	if _, ok := h.state[sk(1, nil)]; !ok {
		t.Errorf("empty value in state 1 not stored: %v", h.state)
	}
}

func TestImportEmitTimersTimeLog(t *testing.T) {
	in2, h2 := newProbe(t, Limits{MaxEmitValue: 128, MaxEmitsPerCall: 4, MaxLogMessage: 8})
	in2.poke(t, probeData, []byte(`"hello"0123456789012345678901234567890123`))
	h2.wm = 12345
	before := time.Now().UnixMilli()
	res := runProbe(t, in2, h2, []byte("key1"),
		op(4, probeData, 1, probeData, 7),
		op(4, 0, 0, probeData, 129),
		op(4, 0, 0, 1<<20, 4),
		op(5, 1000),
		op(5, 2000),
		op(6, 1000),
		op(7),
		op(8),
		op(9, 3, probeData, 20),
		op(9, 1, 1<<20, 5),
		op(4, 0, 0, probeData, 7),
		op(4, 0, 0, probeData, 7), // 11: 4th emit in the call: the limit
	)
	after := time.Now().UnixMilli()
	if res[0] != 0 || res[1] != -4 || res[2] != -3 || res[3] != 0 || res[4] != 0 || res[5] != 0 {
		t.Errorf("emit/timer results %v", res[:6])
	}
	if res[6] != 12345 {
		t.Errorf("watermark %d", res[6])
	}
	if res[7] < before || res[7] > after {
		t.Errorf("processing_time %d not in [%d, %d]", res[7], before, after)
	}
	if res[10] != 0 || res[11] != 0 {
		t.Errorf("emits 3 and 4: %v", res[10:12])
	}
	if fmt.Sprint(h2.emits[0]) != `[" "hello"]` {
		t.Errorf("first emit %q", h2.emits[0])
	}
	if !h2.timers[2000] || h2.timers[1000] {
		t.Errorf("timers %v", h2.timers)
	}
	if len(h2.logs) != 1 || h2.logs[0] != `error: "hello"0` {
		t.Errorf("logs %q", h2.logs)
	}
}

func TestEmitLimitPerCall(t *testing.T) {
	in, h := newProbe(t, Limits{MaxEmitsPerCall: 2})
	in.poke(t, probeData, []byte(`1`))
	h.emits = nil
	script := bytes.Join([][]byte{op(4, 0, 0, probeData, 1), op(4, 0, 0, probeData, 1)}, nil)
	if err := in.Process([]byte("k"), script, 0); err != nil {
		t.Fatal(err)
	}
	// Two emits fill the limit; the probe's results emit is refused with TOO_LARGE (dropped).
	if len(h.emits) != 2 {
		t.Fatalf("emits %v", h.emits)
	}
}

func TestImportLookupConformance(t *testing.T) {
	in, h := newProbe(t, Limits{MaxLookupRequest: 64})
	var gotReq string
	h.lookup = func(ep uint32, req []byte) (int, []byte, error) {
		gotReq = string(req)
		switch {
		case strings.HasPrefix(gotReq, "GET /big"):
			return 200, bytes.Repeat([]byte("x"), 100), nil
		case strings.HasPrefix(gotReq, "GET /timeout"):
			return 0, nil, LookupTimeout
		case strings.HasPrefix(gotReq, "GET /missing"):
			return 404, []byte("nope"), nil
		}
		return 200, []byte(`{"ok":true}`), nil
	}
	req := "GET /v1/geo?ip=1.2.3.4"
	in.poke(t, probeData, []byte(req+"GET /big"+"GET /timeout"+"GET /missing"))
	const buf = 4096
	res := runProbe(t, in, h, []byte("k"),
		op(10, 0, probeData, int64(len(req)), buf, 64),   // 0 ok -> 200<<32 | 11
		op(10, 0, probeData+22, 8, buf, 64),              // 1 big -> pending
		op(3, buf+100, 100),                              // 2 take_result 100
		op(10, 0, probeData+30, 12, buf, 64),             // 3 timeout
		op(10, 0, probeData+42, 12, buf, 64),             // 4 404
		op(10, 1, probeData, 4, buf, 64),                 // 5 unknown endpoint
		op(10, 0, probeData, 65, buf, 64),                // 6 request too large
		op(10, 0, 1<<20, 4, buf, 64),                     // 7 request OOB
		op(10, 0, probeData, int64(len(req)), 1<<20, 64), // 8 buffer OOB
	)
	want := []int64{200<<32 | 11, 200<<32 | 100, 100, -16, 404<<32 | 4, -2, -4, -3, -3}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		t.Fatalf("results\n got %v\nwant %v", res, want)
	}
	if in.peek(t, buf+100, 100) != strings.Repeat("x", 100) {
		t.Error("take_result after lookup copied wrong bytes")
	}
}

// TestNotAllowed covers the permission matrix of docs/abi.md: which imports work in which
// export call.
func TestNotAllowed(t *testing.T) {
	in, _ := newProbe(t, Limits{})
	na := i32result(NotAllowed)
	na64 := i64code(NotAllowed)
	for _, k := range []callKind{callManifest, callKey, callInput, callNone} {
		in.kind = k
		if in.get(0, 0, 0, 0, 0) != na || in.put(0, 0, 0, 0, 0) != na || in.delete(0, 0, 0) != na ||
			in.emit(0, 0, 0, 0) != na || in.timer(1, true) != na || in.lookup(0, 0, 0, 0, 0) != na64 {
			t.Errorf("%s: an import was allowed", callExport[k])
		}
	}
	for _, k := range []callKind{callOpen, callInit} {
		in.kind = k
		if in.get(0, 0, 0, 0, 0) != na || in.put(0, 0, 0, 0, 0) != na || in.emit(0, 0, 0, 0) != na || in.timer(1, true) != na {
			t.Errorf("%s: state, timer or emit allowed", callExport[k])
		}
	}
	in.kind = callClose
	if in.get(0, 0, 0, 0, 0) != na || in.timer(1, false) != na {
		t.Error("clink_close: state or timers allowed")
	}
	if in.emit(0, 0, 0, 0) != 0 {
		t.Error("clink_close: emit refused")
	}
	in.kind = callNone
}

func TestKeyFunction(t *testing.T) {
	e := newEngine(t, Limits{})
	m := load(t, e, "keyfn")
	if !m.HasKey() {
		t.Fatal("HasKey false")
	}
	h := newRec()
	in, err := m.Instantiate(context.Background(), h)
	if err != nil {
		t.Fatal(err)
	}
	k, err := in.Key([]byte("abcdef"))
	if err != nil || string(k) != "abc" {
		t.Fatalf("key %q, %v", k, err)
	}
	if _, err := in.Key([]byte("ab")); !errors.Is(err, ErrKeyRejected) {
		t.Fatalf("short value: %v", err)
	}
	if err := in.Process([]byte("xyz"), []byte("xyz..."), 0); err != nil {
		t.Fatal(err)
	}
	if h.emits[0][1] != `"xyz"` {
		t.Fatalf("emit %v", h.emits)
	}
}

func TestFaults(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		fixture string
		limits  Limits
		kind    FaultKind
		want    []string
	}{
		{"trap", Limits{}, FaultTrap, []string{`operator "trapper"`, "clink_process trapped", "unreachable", `guest said: "negative amount"`}},
		{"badreturn", Limits{}, FaultReturn, []string{"returned error status 7", `guest said: "cannot parse record"`}},
		{"loop", Limits{CallTime: 100 * time.Millisecond}, FaultTimeLimit, []string{"exceeded its time limit", "100ms"}},
		{"fib", Limits{CallTime: 100 * time.Millisecond}, FaultTimeLimit, []string{"exceeded its time limit"}},
		{"recursion", Limits{}, FaultTrap, []string{"stack overflow"}},
		{"membomb", Limits{MemoryPages: 64}, FaultOutOfMemory, []string{"ran out of memory", "out of bounds memory access", "3136 KiB of a 4096 KiB limit"}},
		{"exit", Limits{}, FaultExit, []string{"called proc_exit(3)"}},
		{"stderr", Limits{}, FaultTrap, []string{`guest said: "panic: index out of range [3] with length 2"`}},
	}
	for _, tc := range cases {
		t.Run(tc.fixture, func(t *testing.T) {
			e := newEngine(t, tc.limits)
			m := load(t, e, tc.fixture)
			h := newRec()
			in, err := m.Instantiate(ctx, h)
			if err != nil {
				t.Fatal(err)
			}
			err = in.Process([]byte("k"), []byte("{}"), 0)
			var f *Fault
			if !errors.As(err, &f) {
				t.Fatalf("want *Fault, got %v", err)
			}
			if f.Kind != tc.kind {
				t.Errorf("kind %v, want %v (%v)", f.Kind, tc.kind, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not mention %q", err, w)
				}
			}
			if !in.Broken() {
				t.Error("instance not marked broken")
			}
			if err := in.Process([]byte("k"), nil, 0); err == nil {
				t.Error("a broken instance accepted another call")
			}
			in.Close(ctx)
		})
	}
}

func TestHostErrorAbortsCall(t *testing.T) {
	in, h := newProbe(t, Limits{})
	h.emitErr = errors.New("output is not valid JSON")
	err := in.Process([]byte("k"), op(7), 0)
	var f *Fault
	if !errors.As(err, &f) || f.Kind != FaultHost || !strings.Contains(err.Error(), "output is not valid JSON") {
		t.Fatalf("got %v", err)
	}
	in2, h2 := newProbe(t, Limits{})
	h2.getErr = errors.New("remote tier unreachable")
	err = in2.Process([]byte("k"), op(0, 0, 0, 0, 0, 0), 0)
	if !errors.As(err, &f) || f.Kind != FaultHost || !strings.Contains(err.Error(), "remote tier unreachable") {
		t.Fatalf("got %v", err)
	}
}

func TestCancellationStopsRunningCall(t *testing.T) {
	e := newEngine(t, Limits{CallTime: time.Hour})
	m := load(t, e, "loop")
	ctx, cancel := context.WithCancelCause(context.Background())
	in, err := m.Instantiate(ctx, newRec())
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(50*time.Millisecond, func() { cancel(errors.New("operator stopped by user")) })
	err = in.Process([]byte("k"), nil, 0)
	var f *Fault
	if !errors.As(err, &f) || f.Kind != FaultCancelled || !strings.Contains(err.Error(), "operator stopped by user") {
		t.Fatalf("got %v", err)
	}
}

func TestLargeRecordsGrowInputBuffer(t *testing.T) {
	e := newEngine(t, Limits{})
	m := load(t, e, "keyfn")
	h := newRec()
	in, err := m.Instantiate(context.Background(), h)
	if err != nil {
		t.Fatal(err)
	}
	// keyfn's clink_input returns a fixed buffer at 4096 in a 1-page memory: a record of
	// 64 KiB cannot fit, and the host must refuse rather than write out of bounds.
	err = in.Process([]byte("k"), bytes.Repeat([]byte("x"), 64<<10), 0)
	if err == nil || !strings.Contains(err.Error(), "clink_input returned a buffer outside memory") {
		t.Fatalf("got %v", err)
	}
}

// TestWASISandbox: no directory is preopened, so a guest's filesystem access fails with EBADF;
// randomness and clocks work.
func TestWASISandbox(t *testing.T) {
	e := newEngine(t, Limits{})
	m := load(t, e, "wasifs")
	h := newRec()
	in, err := m.Instantiate(context.Background(), h)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close(context.Background())
	if err := in.Process(nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	v := []byte(h.emits[0][1])
	const ebadf, esuccess = 8, 0
	got := []uint32{binary.LittleEndian.Uint32(v), binary.LittleEndian.Uint32(v[4:]), binary.LittleEndian.Uint32(v[8:]), binary.LittleEndian.Uint32(v[12:])}
	if got[0] != ebadf || got[1] != ebadf || got[2] != esuccess || got[3] != esuccess {
		t.Fatalf("errnos prestat, path_open, random_get, clock_time_get = %v; want [8 8 0 0]", got)
	}
}
