package wasmbin_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/clink-wasm/clink-wasm/internal/wasmbin"
)

// features is everything wazero v1.12 can enable, so that fixtures using
// threads, tail calls, exceptions and typed function references compile.
const features = api.CoreFeaturesV2 |
	experimental.CoreFeaturesThreads |
	experimental.CoreFeaturesTailCall |
	experimental.CoreFeaturesExtendedConst |
	experimental.CoreFeaturesExceptionHandling |
	experimental.CoreFeaturesTypedFunctionReferences

// cache is shared by every runtime in the tests: the same fixtures are
// compiled again and again.
var cache = wazero.NewCompilationCache()

func newRuntime(t testing.TB) wazero.Runtime {
	t.Helper()
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx,
		wazero.NewRuntimeConfig().WithCoreFeatures(features).WithCompilationCache(cache))
	t.Cleanup(func() { _ = r.Close(ctx) })
	return r
}

// errOutOfFuel is what the test fuel import panics with when its call limit
// is reached.
var errOutOfFuel = errors.New("out of fuel")

// fuel is a test implementation of the fuel import.
type fuel struct {
	refill int32 // returned by every call
	limit  int   // panic with errOutOfFuel on this call; 0 means never
	calls  int   // calls so far
	// check, if set, runs on every call and panics with its error.
	check func(context.Context) error
}

func (f *fuel) exhausted(ctx context.Context, _ api.Module, stack []uint64) {
	f.calls++
	if f.check != nil {
		if err := f.check(ctx); err != nil {
			panic(err)
		}
	}
	if f.limit > 0 && f.calls >= f.limit {
		panic(errOutOfFuel)
	}
	stack[0] = api.EncodeI32(f.refill)
}

func (f *fuel) instantiate(t testing.TB, r wazero.Runtime) {
	t.Helper()
	_, err := r.NewHostModuleBuilder(wasmbin.FuelImportModule).
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(f.exhausted), nil, []api.ValueType{api.ValueTypeI32}).
		Export(wasmbin.FuelImportName).
		Instantiate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
}

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func instrument(t testing.TB, bin []byte) []byte {
	t.Helper()
	in := bytes.Clone(bin)
	out, err := wasmbin.Instrument(bin)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(in, bin) {
		t.Fatal("Instrument modified its input")
	}
	return out
}

// instantiate instantiates bin in a fresh runtime next to testdata/env.wasm
// (which provides the imports of some fixtures) and, if f is not nil, the fuel
// import.
func instantiate(t testing.TB, bin []byte, f *fuel) api.Module {
	t.Helper()
	ctx := context.Background()
	r := newRuntime(t)
	if _, err := r.InstantiateWithConfig(ctx, readFixture(t, "env.wasm"), wazero.NewModuleConfig().WithName("env")); err != nil {
		t.Fatal(err)
	}
	if f != nil {
		f.instantiate(t, r)
	}
	mod, err := r.InstantiateWithConfig(ctx, bin, wazero.NewModuleConfig().WithName("guest"))
	if err != nil {
		t.Fatal(err)
	}
	return mod
}

// callExport calls an exported function and clears the bits of 32-bit
// results that wazero leaves undefined.
func callExport(ctx context.Context, mod api.Module, fn string, args ...uint64) ([]uint64, error) {
	f := mod.ExportedFunction(fn)
	res, err := f.Call(ctx, args...)
	for i, t := range f.Definition().ResultTypes() {
		if i < len(res) && (t == api.ValueTypeI32 || t == api.ValueTypeF32) {
			res[i] &= math.MaxUint32
		}
	}
	return res, err
}

type call struct {
	fn   string
	args []uint64
	want []uint64 // nil: only compare with the original
	trap bool     // the call is expected to fail (in both modules)
}

func c(fn string, args ...uint64) call { return call{fn: fn, args: args} }

func (c call) returns(want ...uint64) call { c.want = want; return c }

func (c call) traps() call { c.trap = true; return c }

func i32(v int32) uint64 { return api.EncodeI32(v) }

// TestInstrumentPreservesBehaviour runs the same calls on each fixture and its
// instrumented copy, in order on one instance each, and requires the same
// results. The fuel import refills only 3 units at a time, so the refill path
// runs constantly.
func TestInstrumentPreservesBehaviour(t *testing.T) {
	tests := []struct {
		file  string
		calls []call
	}{
		{"empty.wasm", nil},
		{"memonly.wasm", nil},
		{"arith.wasm", []call{
			c("add", 2, 3).returns(5),
			c("fact", 20).returns(2432902008176640000),
			c("fib", 0).returns(0),
			c("fib", 1).returns(1),
			c("fib", 10).returns(55),
			c("fib", 90).returns(2880067194370816120),
		}},
		{"calls.wasm", []call{
			c("started").returns(42), // set by the start function
			c("apply", 0, 7, 5).returns(12),
			c("apply", 1, 7, 5).returns(2),
			c("apply", 2, 7, 5).returns(35),
			c("apply", 3, 7, 5).returns(24), // double_add calls an import
			c("apply", 4, 7, 5).traps(),     // past the table
			c("chain", 4).returns(29),
			c("bump").returns(101),
			c("bump").returns(102),
			c("add_alias", 1, 2).returns(3),
		}},
		{"elems.wasm", []call{
			c("call0", 0).returns(1), c("call0", 1).returns(2), c("call0", 2).returns(10),
			c("call0", 4).returns(5), c("call0", 5).traps(), c("call0", 6).returns(10),
			c("call1", 0).returns(4), c("call1", 1).returns(3), c("call1", 2).returns(10),
			c("call1", 4).returns(2), c("call1", 5).returns(6), c("call1", 6).traps(),
			c("is_null", 5).returns(1), c("is_null", 4).returns(0),
			c("init"),
			c("call0", 6).returns(3), c("call0", 7).returns(4),
			c("call1", 6).returns(6), c("call1", 7).traps(),
			c("refs").returns(56),
		}},
		{"loops.wasm", []call{
			c("count", 1).returns(1),
			c("count", 1000).returns(1000),
			c("sum_params", 100).returns(5050),
			c("swap_loop", 1, 2, 3).returns(2, 1),
			c("swap_loop", 1, 2, 4).returns(1, 2),
			c("nested", 7, 9).returns(63),
			c("state_machine", 10),
			c("state_machine", 0).returns(0),
			c("branchy", 5).returns(15),
			c("branchy", 4).returns(20),
			c("recurse", 1000).returns(1000),
		}},
		{"simd.wasm", []call{
			c("dot"),
			c("lanes", 5),
			c("minmax", api.EncodeF32(1.5), api.EncodeF32(2.5)).returns(api.EncodeF32(3.5)),
		}},
		{"atomics.wasm", []call{
			c("add_loop", 10).returns(10),
			c("add_loop", 5).returns(15),
			c("cas", 0, 7).returns(0),
			c("cas", 7, 9).returns(7),
			c("notify_wait").returns(2),
			c("narrow").returns(0xff),
		}},
		{"bulk.wasm", []call{
			c("mem_ops"),
			c("tables").returns(4*100 + 3*1000 + 7 + 7),
			c("trunc_sat", api.EncodeF64(1e20)),
			c("trunc_sat", api.EncodeF64(-3.7)),
			c("trunc_sat", api.EncodeF64(math.NaN())).returns(0),
		}},
		{"tailcall.wasm", []call{
			c("is_even", 1_000_000).returns(1),
			c("is_odd", 1_000_001).returns(1),
			c("is_even", 7).returns(0),
		}},
		{"asguest.wasm", []call{ // AssemblyScript compiler output
			c("fib", 90).returns(2880067194370816120),
			c("churn", 50),
			c("churn", 200),
		}},
		{"exceptions.wasm", []call{
			c("catch", 5).returns(i32(-1)),
			c("catch", 42).returns(42),
			c("rethrow", 5).returns(i32(-2)),
			c("rethrow", 42).returns(42),
			c("retry_loop", 5).returns(5),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			bin := readFixture(t, tt.file)
			orig := instantiate(t, bin, nil)
			f := &fuel{refill: 3}
			inst := instantiate(t, instrument(t, bin), f)
			ctx := context.Background()
			for _, c := range tt.calls {
				name := fmt.Sprintf("%s%v", c.fn, c.args)
				want, wantErr := callExport(ctx, orig, c.fn, c.args...)
				got, err := callExport(ctx, inst, c.fn, c.args...)
				if c.trap {
					if wantErr == nil || err == nil {
						t.Errorf("%s: want traps, got original %v, instrumented %v", name, wantErr, err)
					}
					continue
				}
				if wantErr != nil || err != nil {
					t.Fatalf("%s: original: %v, instrumented: %v", name, wantErr, err)
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%s: instrumented returned %v, original %v", name, got, want)
				}
				if c.want != nil && fmt.Sprint(want) != fmt.Sprint(c.want) {
					t.Errorf("%s: original returned %v, want %v", name, want, c.want)
				}
			}
			if len(tt.calls) > 0 && f.calls == 0 {
				t.Error("the fuel import was never called")
			}
		})
	}
}

// TestFuelCount checks how often the import is called: a function whose loop
// runs n iterations passes n+1 checks (its entry and n loop headers), and a
// refill of r lasts r checks, including the one that asked for it.
func TestFuelCount(t *testing.T) {
	bin := instrument(t, readFixture(t, "loops.wasm"))
	ceilDiv := func(a, b int) int { return (a + b - 1) / b }
	tests := []struct {
		n      int   // loop iterations per call
		calls  int   // calls of count(n) on one instance
		refill int32 // what the import returns
		want   int   // import calls
	}{
		{n: 1, calls: 1, refill: 1, want: 2},
		{n: 10, calls: 1, refill: 1, want: 11},
		{n: 10, calls: 1, refill: 3, want: ceilDiv(11, 3)},
		{n: 1000, calls: 1, refill: 100, want: ceilDiv(1001, 100)},
		{n: 1000, calls: 1, refill: 1001, want: 1},
		{n: 1000, calls: 1, refill: 1 << 20, want: 1},
		// Fuel carries over from call to call on the same instance.
		{n: 10, calls: 2, refill: 7, want: ceilDiv(22, 7)},
		{n: 1000, calls: 10, refill: 1 << 20, want: 1},
		// A refill of 0 or less means "check again at the next check".
		{n: 10, calls: 1, refill: 0, want: 11},
		{n: 10, calls: 1, refill: -5, want: 11},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("n=%d,calls=%d,refill=%d", tt.n, tt.calls, tt.refill), func(t *testing.T) {
			t.Parallel()
			f := &fuel{refill: tt.refill}
			mod := instantiate(t, bin, f)
			for range tt.calls {
				res, err := mod.ExportedFunction("count").Call(context.Background(), uint64(tt.n))
				if err != nil {
					t.Fatal(err)
				}
				if int(res[0]) != tt.n {
					t.Fatalf("count(%d) = %d", tt.n, res[0])
				}
			}
			if f.calls != tt.want {
				t.Errorf("fuel import called %d times, want %d", f.calls, tt.want)
			}
		})
	}
}

// TestRunawayStopped checks that guest code that never returns is stopped
// when the fuel import panics: a loop, and unbounded recursion that would
// otherwise end only when the stack overflows... after a long time.
func TestRunawayStopped(t *testing.T) {
	tests := []struct {
		file, fn string
		args     []uint64
	}{
		{"loops.wasm", "spin", nil},
		{"tailcall.wasm", "is_even", []uint64{math.MaxInt64}}, // tail calls: constant stack
		{"asguest.wasm", "spin", nil},
	}
	for _, tt := range tests {
		t.Run(tt.file+"/"+tt.fn, func(t *testing.T) {
			t.Parallel()
			f := &fuel{refill: 1000, limit: 5}
			mod := instantiate(t, instrument(t, readFixture(t, tt.file)), f)
			_, err := mod.ExportedFunction(tt.fn).Call(context.Background(), tt.args...)
			if !errors.Is(err, errOutOfFuel) {
				t.Fatalf("got %v, want %v", err, errOutOfFuel)
			}
			if f.calls != f.limit {
				t.Errorf("fuel import called %d times, want %d", f.calls, f.limit)
			}
		})
	}
}

// TestContextCancellation shows the intended use: the fuel import checks the
// call's context and aborts the call when it is done.
func TestContextCancellation(t *testing.T) {
	f := &fuel{refill: 10_000, check: context.Cause}
	mod := instantiate(t, instrument(t, readFixture(t, "loops.wasm")), f)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	// spin never returns on its own: were the check not to abort it, the call would hang until
	// go test's own timeout.
	_, err := mod.ExportedFunction("spin").Call(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want %v", err, context.DeadlineExceeded)
	}
}

// TestCheckCount counts the inserted checks in loops.wasm: one per defined
// function and one per loop.
func TestCheckCount(t *testing.T) {
	const funcs, loops = 8, 10
	out := instrument(t, readFixture(t, "loops.wasm"))
	// loops.wasm has no imports and no globals, so the fuel import is
	// function 0 and $fuel is global 0.
	check := []byte{
		0x02, 0x40, 0x23, 0x00, 0x41, 0x01, 0x6b, 0x24, 0x00, 0x23, 0x00, 0x41, 0x00, 0x4e,
		0x0d, 0x00, 0x10, 0x00, 0x41, 0x01, 0x6b, 0x24, 0x00, 0x0b,
	}
	if n := bytes.Count(out, check); n != funcs+loops {
		t.Errorf("found %d fuel checks, want %d", n, funcs+loops)
	}
}

// TestNames checks that the name section still names the right functions and
// parameters after renumbering, and names the fuel import.
func TestNames(t *testing.T) {
	ctx := context.Background()
	r := newRuntime(t)
	orig, err := r.CompileModule(ctx, readFixture(t, "calls.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	inst, err := r.CompileModule(ctx, instrument(t, readFixture(t, "calls.wasm")))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range orig.ExportedFunctions() {
		got := inst.ExportedFunctions()[name]
		if got.Name() != want.Name() || fmt.Sprint(got.ParamNames()) != fmt.Sprint(want.ParamNames()) {
			t.Errorf("export %s: got %s%v, want %s%v", name, got.Name(), got.ParamNames(), want.Name(), want.ParamNames())
		}
	}
	var imports []string
	for _, d := range inst.ImportedFunctions() {
		imports = append(imports, d.Name())
	}
	if want := "[double triple clink_internal.fuel_exhausted]"; fmt.Sprint(imports) != want {
		t.Errorf("imported function names: %v, want %s", imports, want)
	}
}

// TestRefusesReinstrumenting: instrumented output imports clink_internal,
// so it is refused.
func TestRefusesReinstrumenting(t *testing.T) {
	out := instrument(t, readFixture(t, "calls.wasm"))
	_, err := wasmbin.Instrument(out)
	if !errors.Is(err, wasmbin.ErrReservedImport) {
		t.Fatalf("got %v, want %v", err, wasmbin.ErrReservedImport)
	}
}
