package sdktest

import (
	"context"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// BenchmarkInstance reports what one instance of each counter module costs in the production
// host: the time to instantiate it and run _initialize and clink_open (ns/op), its linear
// memory after one record (linear-B/instance), and the growth of the Go heap per live instance
// (heap-B/instance: linear memory plus wazero's and the host's structures), over 200 live
// instances.
func BenchmarkInstance(b *testing.B) {
	ctx := context.Background()
	for _, name := range []string{"counter-go.wasm", "counter-as.wasm", "counter-c.wasm", "counter-rust.wasm"} {
		b.Run(name, func(b *testing.B) {
			m := module(b, filepath.Join(examplesDir, "counter", name)) // compiles the module
			h := newHandler(b)
			instantiate := func() *abi.Instance {
				in, err := m.Instantiate(ctx, h)
				if err != nil {
					b.Fatal(err)
				}
				return in
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
			ins := make([]*instance, live)
			var linear uint64
			for i := range ins {
				ins[i] = &instance{t: b, h: h, in: instantiate()}
				// One record, so the input buffer, the output area and the frames exist.
				if _, err := ins[i].process("k", `{"user":"k"}`, 0); err != nil {
					b.Fatal(err)
				}
				linear += ins[i].in.MemoryBytes()
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(linear)/live, "linear-B/instance")
			b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/live, "heap-B/instance")
			for _, in := range ins {
				in.in.Close(ctx)
			}
		})
	}
}
