package abi

import (
	"context"
	"testing"
	"time"
)

// BenchmarkInstanceLifecycle is what one instance of a small module costs to create and to
// close when a run holds many at once, as the suspension path does (every suspended call holds
// an instance; issue 11): n instances of the WAT counter are made one after the other, each
// processes one record (touching its memory as a first call would), and all are then closed.
// It reports the microseconds per instance for each phase: closing as the caller sees it, and
// the wait for the engine's releaser to finish (release.go) after that.
func BenchmarkInstanceLifecycle(b *testing.B) {
	const n = 512
	e := newEngine(b, Limits{})
	m := load(b, e, "counter")
	ctx := context.Background()
	insts := make([]*Instance, n)
	var create, closing, release time.Duration
	for b.Loop() {
		t0 := time.Now()
		for i := range insts {
			in, err := m.Instantiate(ctx, newRec())
			if err != nil {
				b.Fatal(err)
			}
			insts[i] = in
		}
		t1 := time.Now()
		for _, in := range insts {
			if err := in.Process([]byte("k"), []byte("v"), 0); err != nil {
				b.Fatal(err)
			}
		}
		t2 := time.Now()
		for _, in := range insts {
			in.Close(ctx)
		}
		t3 := time.Now()
		e.rel.wait() // closed modules still being released: not during the next round's creation
		create += t1.Sub(t0)
		closing += t3.Sub(t2)
		release += time.Since(t3)
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N*n) / 1e3 }
	b.ReportMetric(per(create), "create-µs/inst")
	b.ReportMetric(per(closing), "close-µs/inst")
	b.ReportMetric(per(release), "release-wait-µs/inst")
}
