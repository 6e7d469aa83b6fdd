package pipeline_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// BenchmarkPipelineScalingCase runs one case of BenchmarkPipelineNative per process, so that
// a CPU profile, a trace or a goroutine count (go test -cpuprofile / -trace) shows one
// parallelism alone: CLINK_SCALING_CASE=wasm-p1 (default), wasm-p2, native-p1, native-p2.
// It reports records/s and the cores the process kept busy.
func BenchmarkPipelineScalingCase(b *testing.B) {
	c := os.Getenv("CLINK_SCALING_CASE")
	if c == "" {
		c = "wasm-p1"
	}
	kind, p, _ := strings.Cut(c, "-p")
	par, err := strconv.Atoi(p)
	if (kind != "wasm" && kind != "native") || err != nil || par < 1 {
		b.Fatalf("CLINK_SCALING_CASE=%q: want wasm-pN or native-pN", c)
	}
	n := b.N
	if n < 100_000 {
		n = 1_000_000
	}
	env := pipeline.Env{StateURL: "mem://"}
	if kind == "native" {
		env.Native = map[string]func() pipeline.NativeOperator{"count": nativeCounter}
	}
	spec := counterSpec(par, n, counterWasm(b))
	run0, wait0 := schedstat()
	start := time.Now()
	r, cores := runRateCPU(b, spec, env)
	el := time.Since(start).Seconds()
	run1, wait1 := schedstat()
	b.ReportMetric(r, "rec/s")
	b.ReportMetric(cores, "cores")
	// The kernel's per-thread accounting: time on a CPU and time runnable but waiting for
	// one (other processes had it). run+wait near GOMAXPROCS means the process had work for
	// every P and was starved by the machine; near 1 means something serial held it.
	b.ReportMetric((run1-run0).Seconds()/el, "sched-run-cores")
	b.ReportMetric((wait1-wait0).Seconds()/el, "sched-wait-cores")
}

// schedstat sums /proc/self/task/*/schedstat: nanoseconds on a CPU, and nanoseconds runnable
// on a run queue (Linux only; zero elsewhere).
func schedstat() (run, wait time.Duration) {
	tasks, _ := filepath.Glob("/proc/self/task/*/schedstat")
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var r, w int64
		if _, err := fmt.Sscan(string(b), &r, &w); err == nil {
			run += time.Duration(r)
			wait += time.Duration(w)
		}
	}
	return run, wait
}
