// Package sdktest tests the guest SDKs and the example fixtures as built WebAssembly, through
// the production ABI host (host/abi) with a Handler of its own: keyed state in a map, timers,
// an echo lookup endpoint, and every emit and log line recorded. The SDKs are thereby checked
// against the host that serves them in production, fast paths included (docs/abi.md, "Fast
// paths"), and not against a second implementation of the ABI.
//
//	go test ./guest-sdk/sdktest                                # conformance + example outputs
//	go test ./guest-sdk/sdktest -run '^$' -bench Instance      # per-instance memory and time
//	go test ./guest-sdk/sdktest -run '^$' -bench Counter       # counter: wasm vs native Go
//
// -short skips the Go modules, whose compilation dominates the run time.
package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

type output struct {
	key, value string
}

type logLine struct {
	level int32
	msg   string
}

// handler serves the imports of one instance (abi.Handler). Tests drive one call at a time.
type handler struct {
	t testing.TB

	key       string                    // record key of the current call
	state     map[string][]byte         // record key \x00 state index \x00 entry -> value
	timers    map[string]map[int64]bool // record key -> timestamps
	watermark int64

	order int64 // last set_resume_order
	out   []output
	logs  []logLine
}

func newHandler(t testing.TB) *handler {
	return &handler{t: t, state: map[string][]byte{}, timers: map[string]map[int64]bool{}, watermark: math.MinInt64}
}

func skey(key string, state uint32, entry []byte) string {
	return fmt.Sprintf("%s\x00%d\x00%s", key, state, entry)
}

// stored returns what the host holds for entry of state (by index) under record key.
func (h *handler) stored(key string, state uint32, entry string) (string, bool) {
	v, ok := h.state[skey(key, state, []byte(entry))]
	return string(v), ok
}

func (h *handler) Get(state uint32, entry []byte) ([]byte, bool, error) {
	v, ok := h.state[skey(h.key, state, entry)]
	return v, ok, nil
}

func (h *handler) Put(state uint32, entry, value []byte) error {
	h.state[skey(h.key, state, entry)] = bytes.Clone(value)
	return nil
}

func (h *handler) Delete(state uint32, entry []byte) error {
	delete(h.state, skey(h.key, state, entry))
	return nil
}

func (h *handler) Emit(key, value []byte) error {
	if !json.Valid(value) || bytes.ContainsAny(value, "\n") {
		h.t.Errorf("emit: not one line of JSON: %.200q", value)
	}
	h.out = append(h.out, output{string(key), string(value)})
	return nil
}

func (h *handler) RegisterTimer(ts int64) error {
	if h.timers[h.key] == nil {
		h.timers[h.key] = map[int64]bool{}
	}
	h.timers[h.key][ts] = true
	return nil
}

func (h *handler) DeleteTimer(ts int64) error {
	delete(h.timers[h.key], ts)
	return nil
}

func (h *handler) Watermark() int64 { return h.watermark }

// Lookup: endpoint "echo" answers 200 with the request text, except the path /slow, which
// times out, and /status/N, which answers N with an empty body.
func (h *handler) Lookup(endpoint uint32, request []byte) (int, []byte, error) {
	line, _, _ := strings.Cut(string(request), "\n")
	switch {
	case line == "GET /slow":
		return 0, nil, abi.LookupTimeout
	case strings.HasPrefix(line, "GET /status/"):
		var status int
		fmt.Sscan(strings.TrimPrefix(line, "GET /status/"), &status)
		return status, nil, nil
	}
	return 200, bytes.Clone(request), nil
}

func (h *handler) Log(level abi.LogLevel, msg []byte) {
	h.logs = append(h.logs, logLine{int32(level), string(msg)})
}

func (h *handler) SetResumeOrder(order int64) { h.order = order }

// engine is shared by every test: a module is compiled once (the Go ones take seconds) and
// instantiated as often as tests need.
var engine struct {
	once    sync.Once
	e       *abi.Engine
	err     error
	mu      sync.Mutex
	modules map[string]*abi.Module
}

// module loads the module at path through the production host's checks.
func module(t testing.TB, path string) *abi.Module {
	t.Helper()
	ctx := context.Background()
	engine.once.Do(func() {
		engine.e, engine.err = abi.NewEngine(ctx)
		engine.modules = map[string]*abi.Module{}
	})
	if engine.err != nil {
		t.Fatal(engine.err)
	}
	engine.mu.Lock()
	defer engine.mu.Unlock()
	if m := engine.modules[path]; m != nil {
		return m
	}
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := engine.e.Load(ctx, bin, abi.WithEndpoints("echo"))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	engine.modules[path] = m
	return m
}

// instance is one instantiated guest with the handler serving it.
type instance struct {
	t        testing.TB
	h        *handler
	in       *abi.Instance
	manifest abi.Manifest
}

// load instantiates the module at path (running _initialize and clink_open).
func load(t testing.TB, path string) *instance {
	t.Helper()
	m := module(t, path)
	h := newHandler(t)
	in, err := m.Instantiate(context.Background(), h)
	if err != nil {
		t.Fatalf("instantiate %s: %v", path, err)
	}
	t.Cleanup(func() { in.Close(context.Background()) })
	return &instance{t: t, h: h, in: in, manifest: m.Manifest}
}

// run runs one call for key and returns what it emitted, in order.
func (in *instance) run(key string, call func() error) ([]output, error) {
	in.h.key, in.h.out = key, nil
	err := call()
	out := in.h.out
	in.h.out = nil
	return out, err
}

// process runs one record.
func (in *instance) process(key, value string, ts int64) ([]output, error) {
	return in.run(key, func() error { return in.in.Process([]byte(key), []byte(value), ts) })
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
		o, err := in.run(d.key, func() error { return in.in.OnTimer([]byte(d.key), d.ts) })
		out = append(out, o...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// close runs clink_close and retires the instance.
func (in *instance) close() ([]output, error) {
	return in.run("", func() error { return in.in.Close(context.Background()) })
}

// guestMessage is the guest's own account of a fault: its last error-level log line.
func guestMessage(err error) string {
	var f *abi.Fault
	if errors.As(err, &f) {
		return f.GuestMessage
	}
	return ""
}
