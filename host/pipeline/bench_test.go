package pipeline_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// BenchmarkPipelineCounter: generator -> keyed counter (AssemblyScript) -> discard, at
// parallelism 1 and 2, one record per b.N. The parallel-scaling figure of issue 12 is
// records/s at 2 ÷ records/s at 1 (use /work/shared/tools/bench-median for the ratio).
func BenchmarkPipelineCounter(b *testing.B) {
	for _, par := range []int{1, 2} {
		b.Run(fmt.Sprintf("p%d", par), func(b *testing.B) {
			n := b.N
			spec := fmt.Sprintf(`
name: bench
checkpoints: {interval: 1s}
sources: [{name: g, type: generator, splits: %d, count: %d, keys: 100000, parallelism: %d}]
operators: [{name: count, module: %s, inputs: [g], key: key, parallelism: %d}]
sinks: [{name: out, type: discard, inputs: [count], parallelism: %d}]
`, par, max(n/par, 1), par, counterWasm(b), par, par)
			b.ResetTimer()
			start := time.Now()
			m, err := runSpec(b, spec, pipeline.Env{StateURL: "mem://"})
			if err != nil {
				b.Fatal(err)
			}
			el := time.Since(start)
			var in int64
			for _, s := range m.Sources {
				in += s.RecordsIn
			}
			b.ReportMetric(float64(in)/el.Seconds(), "records/s")
		})
	}
}
