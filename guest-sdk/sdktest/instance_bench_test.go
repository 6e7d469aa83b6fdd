package sdktest

import (
	"context"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/tetratelabs/wazero/api"
)

// BenchmarkInstance reports what one instance of each counter module costs: the time to
// instantiate it and run _initialize and clink_open (ns/op), its linear memory after one
// record (linear-B/instance), and the growth of the Go heap per live instance
// (heap-B/instance: linear memory plus wazero's own structures), over 200 live instances.
func BenchmarkInstance(b *testing.B) {
	ctx := context.Background()
	for _, name := range []string{"counter-go.wasm", "counter-as.wasm"} {
		b.Run(name, func(b *testing.B) {
			in := load(b, filepath.Join(examplesDir, "counter", name)) // compiles the module
			rt, compiled := in.runtime, in.compiled
			instantiate := func() api.Module {
				mod, err := rt.InstantiateModule(ctx, compiled, moduleConfig())
				if err != nil {
					b.Fatal(err)
				}
				if _, err := mod.ExportedFunction("clink_open").Call(ctx); err != nil {
					b.Fatal(err)
				}
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
			mods := make([]*instance, live)
			var linear uint64
			for i := range mods {
				mods[i] = &instance{t: b, h: in.h, mod: instantiate()}
				// One record, so the input and result buffers exist.
				if _, err := mods[i].process("k", `{"user":"k"}`, 0); err != nil {
					b.Fatal(err)
				}
				linear += uint64(mods[i].mod.Memory().Size())
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(linear)/live, "linear-B/instance")
			b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/live, "heap-B/instance")
			for _, m := range mods {
				m.mod.Close(ctx)
			}
		})
	}
}
