package pipeline

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/scheduler"
)

// BenchmarkSource measures the source alone (parse, key, batch) over 200k records of JSON Lines
// and of CSV, reporting records per second. It runs a fixed input per iteration, so
// -benchtime 1x gives a figure.
func BenchmarkSource(b *testing.B) {
	const n = 200_000
	var jl, cs strings.Builder
	cs.WriteString("user,amount,note\n")
	for i := range n {
		fmt.Fprintf(&jl, "{\"user\":\"u%d\",\"amount\":%d,\"note\":\"some text here\"}\n", i%1000, i)
		fmt.Fprintf(&cs, "u%d,%d,some text here\n", i%1000, i)
	}
	for _, c := range []struct {
		name   string
		format Format
		in     string
	}{{"jsonl", FormatJSONL, jl.String()}, {"csv", FormatCSV, cs.String()}} {
		b.Run(c.name, func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				s := newSource(sourceConfig{format: c.format, keyField: "user", maxKey: 1 << 16, maxValue: 1 << 24}, strings.NewReader(c.in))
				ch := make(chan []scheduler.Element, 64)
				done := make(chan struct{})
				go func() {
					for range ch {
					}
					close(done)
				}()
				start := time.Now()
				if err := s.run(ch, make(chan struct{})); err != nil {
					b.Fatal(err)
				}
				<-done
				total += time.Since(start)
			}
			b.ReportMetric(float64(n)*float64(b.N)/total.Seconds(), "records/s")
		})
	}
}
