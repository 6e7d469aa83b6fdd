package scheduler

import (
	"os"
	"runtime"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/state"
)

func mallocs() uint64 { var m runtime.MemStats; runtime.ReadMemStats(&m); return m.Mallocs }

func TestAllocsPerRecord(t *testing.T) {
	m := loadModule(t, counterAS)
	els := benchRecords(100_000, 10_000)
	b := &testing.B{}
	runPlain(b, m, els[:1000])
	a0 := mallocs()
	runPlain(b, m, els)
	a1 := mallocs()
	runController(b, Config{Module: m, Backend: state.NewMemory(), Sink: &discardSink{}}, els)
	a2 := mallocs()
	runNative(els)
	a3 := mallocs()
	t.Logf("allocs/record: plain %.2f controller %.2f native %.2f", float64(a1-a0)/1e5, float64(a2-a1)/1e5, float64(a3-a2)/1e5)
}

func BenchmarkCG(b *testing.B) {
	m := loadModule(b, counterAS)
	els := benchRecords(20_000, 2_000)
	for b.Loop() {
		if os.Getenv("CG") == "plain" {
			runPlain(b, m, els)
		} else {
			runController(b, Config{Module: m, Backend: state.NewMemory(), Sink: &discardSink{}}, els)
		}
	}
}
