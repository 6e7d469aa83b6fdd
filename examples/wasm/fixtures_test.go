//go:build !wasip1

// Tests of the committed .wasm fixtures, independent of the production host: a minimal
// in-test implementation of guest ABI v1 on wazero runs each module over its example's
// input.jsonl and compares with expected.jsonl, and BenchmarkInstance measures what one
// instance of each module costs.
//
//	go test ./examples/wasm                                   # expected output, all fixtures
//	go test ./examples/wasm -run '^$' -bench Instance         # per-instance memory and time
package wasm_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/clinktest"
)

var examples = []string{"counter", "aggregate", "dedup"}

// miniHost is the state of the one call in flight (the tests run one instance at a time).
type miniHost struct {
	key         string
	states      []string
	state       map[string][]byte // record key + "\x00" + state index + "\x00" + entry -> value
	pending     []byte
	havePending bool
	out         [][]byte
	logs        []string
	lastErr     string
}

const (
	rcNotFound       = -1
	rcInvalidArg     = -2
	rcOutOfBounds    = -3
	rcNoResult       = -6
	rcBufferTooSmall = -7
)

func (h *miniHost) read(m api.Module, p, n uint32) ([]byte, bool) {
	return m.Memory().Read(p, n)
}

func (h *miniHost) skey(state uint32, entry []byte) string {
	return fmt.Sprintf("%s\x00%d\x00%s", h.key, state, entry)
}

func (h *miniHost) deliver(m api.Module, v []byte, p, c uint32) {
	h.pending, h.havePending = nil, false
	if uint32(len(v)) <= c {
		m.Memory().Write(p, v)
		return
	}
	h.pending, h.havePending = append([]byte(nil), v...), true
}

// current is the host of the test running (they run one at a time), for failure messages.
var current *miniHost

func newRuntime(ctx context.Context, t testing.TB, h *miniHost) wazero.Runtime {
	current = h
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	i32, i64 := api.ValueTypeI32, api.ValueTypeI64
	b := rt.NewHostModuleBuilder("clink_v1")
	fn := func(name string, params, results []api.ValueType, f func(m api.Module, s []uint64)) {
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, m api.Module, s []uint64) { f(m, s) }), params, results).Export(name)
	}
	fn("get_async", []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i32}, func(m api.Module, s []uint64) {
		h.pending, h.havePending = nil, false
		if int(uint32(s[0])) >= len(h.states) { // i32 arguments arrive with undefined upper bits
			s[0] = api.EncodeI32(rcInvalidArg)
			return
		}
		e, ok := h.read(m, uint32(s[1]), uint32(s[2]))
		if !ok {
			s[0] = api.EncodeI32(rcOutOfBounds)
			return
		}
		v, found := h.state[h.skey(uint32(s[0]), e)]
		if !found {
			s[0] = api.EncodeI32(rcNotFound)
			return
		}
		h.deliver(m, v, uint32(s[3]), uint32(s[4]))
		s[0] = api.EncodeI32(int32(len(v)))
	})
	fn("put", []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i32}, func(m api.Module, s []uint64) {
		e, ok1 := h.read(m, uint32(s[1]), uint32(s[2]))
		v, ok2 := h.read(m, uint32(s[3]), uint32(s[4]))
		if !ok1 || !ok2 {
			s[0] = api.EncodeI32(rcOutOfBounds)
			return
		}
		h.state[h.skey(uint32(s[0]), e)] = append([]byte{}, v...)
		s[0] = 0
	})
	fn("delete", []api.ValueType{i32, i32, i32}, []api.ValueType{i32}, func(m api.Module, s []uint64) {
		e, _ := h.read(m, uint32(s[1]), uint32(s[2]))
		delete(h.state, h.skey(uint32(s[0]), e))
		s[0] = 0
	})
	fn("take_result", []api.ValueType{i32, i32}, []api.ValueType{i32}, func(m api.Module, s []uint64) {
		switch {
		case !h.havePending:
			s[0] = api.EncodeI32(rcNoResult)
		case uint32(len(h.pending)) > uint32(s[1]):
			s[0] = api.EncodeI32(rcBufferTooSmall)
		default:
			m.Memory().Write(uint32(s[0]), h.pending)
			s[0] = api.EncodeI32(int32(len(h.pending)))
			h.pending, h.havePending = nil, false
		}
	})
	fn("emit", []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}, func(m api.Module, s []uint64) {
		v, ok := h.read(m, uint32(s[2]), uint32(s[3]))
		if !ok || !json.Valid(v) {
			t.Errorf("emit: invalid value %q", v)
		}
		h.out = append(h.out, append([]byte{}, v...))
		s[0] = 0
	})
	fn("timer_register", []api.ValueType{i64}, []api.ValueType{i32}, func(m api.Module, s []uint64) { s[0] = 0 })
	fn("timer_delete", []api.ValueType{i64}, []api.ValueType{i32}, func(m api.Module, s []uint64) { s[0] = 0 })
	fn("watermark", nil, []api.ValueType{i64}, func(m api.Module, s []uint64) { s[0] = api.EncodeI64(math.MinInt64) })
	fn("processing_time", nil, []api.ValueType{i64}, func(m api.Module, s []uint64) { s[0] = 0 })
	fn("log", []api.ValueType{i32, i32, i32}, nil, func(m api.Module, s []uint64) {
		msg, _ := h.read(m, uint32(s[1]), uint32(s[2]))
		h.logs = append(h.logs, string(msg))
		if int32(s[0]) >= 3 {
			h.lastErr = string(msg)
		}
	})
	fn("lookup", []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i64}, func(m api.Module, s []uint64) {
		s[0] = api.EncodeI64(-20) // LOOKUP_UNAVAILABLE
	})
	if _, err := b.Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	return rt
}

func moduleConfig() wazero.ModuleConfig {
	// An anonymous instance name so that many instances of one module can coexist.
	return wazero.NewModuleConfig().WithName("").WithStartFunctions("_initialize").WithStderr(os.Stderr)
}

func fixtures(t testing.TB) []string {
	var out []string
	for _, e := range examples {
		for _, lang := range []string{"go", "as"} {
			out = append(out, filepath.Join(e, e+"-"+lang+".wasm"))
		}
	}
	return out
}

func TestFixturesExpectedOutput(t *testing.T) {
	ctx := context.Background()
	for _, path := range fixtures(t) {
		t.Run(path, func(t *testing.T) {
			h := &miniHost{state: map[string][]byte{}}
			rt := newRuntime(ctx, t, h)
			defer rt.Close(ctx)
			bin, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			mod, err := rt.InstantiateWithConfig(ctx, bin, moduleConfig())
			if err != nil {
				t.Fatal(err)
			}
			packed := call(t, mod, "clink_manifest")
			mb, _ := mod.Memory().Read(uint32(packed>>32), uint32(packed))
			var manifest struct {
				ABI    int      `json:"abi"`
				Name   string   `json:"name"`
				States []string `json:"states"`
			}
			if err := json.Unmarshal(mb, &manifest); err != nil || manifest.ABI != 1 {
				t.Fatalf("manifest %q: %v", mb, err)
			}
			h.states = manifest.States
			if rc := call(t, mod, "clink_open"); rc != 0 {
				t.Fatalf("clink_open = %d", rc)
			}

			dir := filepath.Dir(path)
			in, err := os.ReadFile(filepath.Join(dir, "input.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			var inPtr, inCap uint32
			sc := bufio.NewScanner(bytes.NewReader(in))
			for line := 1; sc.Scan(); line++ {
				rec := sc.Bytes()
				key, err := clinktest.KeyOf(rec, "user")
				if err != nil {
					t.Fatalf("line %d: %v", line, err)
				}
				if n := uint32(len(key) + len(rec)); n > inCap || inPtr == 0 {
					inPtr, inCap = uint32(call(t, mod, "clink_input", uint64(n))), n
				}
				mod.Memory().Write(inPtr, key)
				mod.Memory().Write(inPtr+uint32(len(key)), rec)
				h.key, h.out, h.lastErr = string(key), h.out[:0], ""
				if rc := int32(call(t, mod, "clink_process", uint64(len(key)), uint64(len(rec)), 0)); rc != 0 {
					t.Fatalf("line %d: clink_process = %d: %s", line, rc, h.lastErr)
				}
				for _, o := range h.out {
					got.Write(o)
					got.WriteByte('\n')
				}
			}
			if rc := call(t, mod, "clink_close"); rc != 0 {
				t.Fatalf("clink_close = %d", rc)
			}
			want, err := os.ReadFile(filepath.Join(dir, "expected.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("output differs from %s/expected.jsonl:\n%s", dir, got.Bytes())
			}
		})
	}
}

func call(t testing.TB, mod api.Module, name string, args ...uint64) uint64 {
	t.Helper()
	f := mod.ExportedFunction(name)
	if f == nil {
		t.Fatalf("no export %s", name)
	}
	r, err := f.Call(context.Background(), args...)
	if err != nil {
		t.Fatalf("%s: %v (last error log: %q)", name, err, current.lastErr)
	}
	return r[0]
}

// BenchmarkInstance instantiates each counter module (and runs _initialize and clink_open), and
// reports the time per instance and what a live instance costs: its linear memory after one
// record, and the growth of the Go heap per instance (linear memory plus wazero's own
// structures), measured over 200 live instances.
func BenchmarkInstance(b *testing.B) {
	ctx := context.Background()
	for _, path := range []string{"counter/counter-go.wasm", "counter/counter-as.wasm"} {
		b.Run(filepath.Base(path), func(b *testing.B) {
			h := &miniHost{state: map[string][]byte{}, states: []string{"count"}}
			rt := newRuntime(ctx, b, h)
			defer rt.Close(ctx)
			bin, err := os.ReadFile(path)
			if err != nil {
				b.Fatal(err)
			}
			compiled, err := rt.CompileModule(ctx, bin)
			if err != nil {
				b.Fatal(err)
			}
			cfg := moduleConfig()
			instantiate := func() api.Module {
				mod, err := rt.InstantiateModule(ctx, compiled, cfg)
				if err != nil {
					b.Fatal(err)
				}
				call(b, mod, "clink_open")
				return mod
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				instantiate().Close(ctx)
			}
			b.StopTimer()

			const live = 200
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			mods := make([]api.Module, live)
			var linear uint64
			for i := range mods {
				mods[i] = instantiate()
				// One record, so the input buffer and the result buffers exist.
				p := uint32(call(b, mods[i], "clink_input", 64))
				mods[i].Memory().Write(p, []byte(`k{"user":"k"}`))
				h.key = "k"
				call(b, mods[i], "clink_process", 1, 12, 0)
				linear += uint64(mods[i].Memory().Size())
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(linear)/live, "linear-B/instance")
			b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/live, "heap-B/instance")
			for _, m := range mods {
				m.Close(ctx)
			}
		})
	}
}
