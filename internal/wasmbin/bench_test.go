package wasmbin_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/clink-wasm/clink-wasm/internal/wasmbin"
)

// benchRefill is the fuel the benchmarks' import returns, the order of what
// the host grants (host/abi: 1<<20), so the import itself is almost never
// called and what is measured is the inline check.
const benchRefill = 1 << 20

// compareCalls calls fn on the original and the instrumented module
// alternately and reports the median time of each and their ratio. Medians,
// because on a shared machine preemption adds large outliers to single calls.
func compareCalls(b *testing.B, file, fn string, args ...uint64) {
	bin := readFixture(b, file)
	orig := instantiate(b, bin, nil)
	inst := instantiate(b, instrument(b, bin), &fuel{refill: benchRefill})
	compareFuncs(b, orig.ExportedFunction(fn), inst.ExportedFunction(fn), args...)
}

func compareFuncs(b *testing.B, orig, inst api.Function, args ...uint64) {
	ctx := context.Background()
	stack := make([]uint64, 4)
	call := func(f api.Function) {
		copy(stack, args)
		if err := f.CallWithStack(ctx, stack); err != nil {
			b.Fatal(err)
		}
	}
	var tOrig, tInst []time.Duration
	for b.Loop() {
		t0 := time.Now()
		call(orig)
		t1 := time.Now()
		call(inst)
		t2 := time.Now()
		tOrig = append(tOrig, t1.Sub(t0))
		tInst = append(tInst, t2.Sub(t1))
	}
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Nanoseconds())
	}
	mOrig, mInst := median(tOrig), median(tInst)
	b.ReportMetric(mOrig, "orig-ns/call")
	b.ReportMetric(mInst, "instr-ns/call")
	b.ReportMetric(mInst/mOrig, "instr/orig")
}

// BenchmarkLoopOverhead measures a tight loop of 1000 iterations (loops.wasm
// count), where the check at the loop header is most of the added work.
func BenchmarkLoopOverhead(b *testing.B) {
	compareCalls(b, "loops.wasm", "count", 1000)
}

// BenchmarkCallOverhead measures a call of a tiny function (arith.wasm add),
// where the check at function entry is the added work.
func BenchmarkCallOverhead(b *testing.B) {
	compareCalls(b, "arith.wasm", "add", 1, 2)
}

// BenchmarkGoOverhead measures Go toolchain output (testdata/goguest):
// sum, an empty counting loop of 10000 iterations as the Go compiler emits
// it, which is the worst case (see fuelCheck), and work, which allocates, uses
// maps, sorts, formats and runs a goroutine, like ordinary code.
func BenchmarkGoOverhead(b *testing.B) {
	bin, err := goGuest()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	start := func(bin []byte, f *fuel) api.Module {
		r := newRuntime(b)
		wasi_snapshot_preview1.MustInstantiate(ctx, r)
		if f != nil {
			f.instantiate(b, r)
		}
		mod, err := r.InstantiateWithConfig(ctx, bin, wazero.NewModuleConfig().WithStartFunctions())
		if err != nil {
			b.Fatal(err)
		}
		if _, err := mod.ExportedFunction("_initialize").Call(ctx); err != nil {
			b.Fatal(err)
		}
		return mod
	}
	orig := start(bin, nil)
	inst := start(instrument(b, bin), &fuel{refill: benchRefill})
	for _, c := range []call{c("sum", 10000), c("work", 100)} {
		b.Run(c.fn, func(b *testing.B) {
			compareFuncs(b, orig.ExportedFunction(c.fn), inst.ExportedFunction(c.fn), c.args...)
		})
	}
}

// BenchmarkInstrumentGo measures instrumenting the 2.6 MB Go module.
func BenchmarkInstrumentGo(b *testing.B) {
	bin, err := goGuest()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(bin)))
	for b.Loop() {
		if _, err := wasmbin.Instrument(bin); err != nil {
			b.Fatal(err)
		}
	}
}
