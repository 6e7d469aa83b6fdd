package scheduler

import (
	"context"
	"hash/maphash"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// batchPlainHandler is plainHandler for batch calls: SelectRecord makes record i of the batch
// the current one.
type batchPlainHandler struct {
	*plainHandler
	els []Element
}

func (h *batchPlainHandler) SelectRecord(i int) {
	e := &h.els[i]
	h.key, h.pos, h.ts = e.Key, e.Pos, e.TS
}

// runPlainBatch is runPlain through clink_process_batch: records go to one instance in
// batches of up to n of distinct keys, cut where a key repeats, as the controller forms them
// (batch.go: the key filter, then a comparison).
func runPlainBatch(b *testing.B, m *abi.Module, els []Element, n int) cost {
	ph := &plainHandler{backend: state.NewMemory(), out: newOutBuffer(&discardSink{})}
	h := &batchPlainHandler{plainHandler: ph}
	in, err := m.Instantiate(context.Background(), h)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close(context.Background())
	recs := make([]abi.BatchRecord, 0, n)
	start := startSpan()
	first := 0
	var keys keyFilter
	flush := func(end int) {
		h.els = els[first:end]
		if done, err := in.ProcessBatch(recs); err != nil || done != len(recs) {
			b.Fatalf("batch: %d of %d done: %v", done, len(recs), err)
		}
		recs, first, keys = recs[:0], end, keyFilter{}
	}
	for i := range els {
		k := els[i].Key
		hk := maphash.Bytes(batchSeed, k)
		dup := len(recs) == n
		if !dup && keys.has(hk) {
			for j := range recs {
				if string(recs[j].Key) == string(k) {
					dup = true
					break
				}
			}
		}
		if dup {
			flush(i)
		}
		keys.add(hk)
		recs = append(recs, abi.BatchRecord{Key: k, Value: els[i].Value, TS: els[i].TS})
	}
	if len(recs) > 0 {
		flush(len(els))
	}
	ph.out.flush()
	return start.end()
}

// BenchmarkCallBatch: the controller on the all-hits path with batch calls (DefaultCallBatch)
// against the same controller making a call per record (WithCallBatch(1)), for the counter
// guests that export clink_process_batch (the AssemblyScript one does not by default), in CPU
// time per record (medians of alternating rounds).
func BenchmarkCallBatch(b *testing.B) {
	els := benchRecords(50_000, 10_000)
	for _, g := range []struct{ name, path string }{{"as", counterAS}, {"go", counterGo}} {
		b.Run(g.name, func(b *testing.B) { benchCallBatch(b, g.name, g.path, els) })
	}
}

func benchCallBatch(b *testing.B, name, path string, els []Element) {
	g := struct{ name string }{name}
	{
		m := loadModule(b, path)
		if !m.HasBatch() {
			b.Skipf("%s does not export clink_process_batch", path)
		}
		run := func(n int) float64 {
			cpu0 := threadCPU()
			runController(b, m, state.NewMemory(), els, WithCallBatch(n))
			return perRec(threadCPU()-cpu0, len(els))
		}
		for b.Loop() {
			var own, bat []float64
			onThread(func() {
				for r := range 11 {
					if r%2 == 0 {
						own, bat = append(own, run(1)), append(bat, run(DefaultCallBatch))
					} else {
						bat, own = append(bat, run(DefaultCallBatch)), append(own, run(1))
					}
				}
			})
			b.ReportMetric(median(own), g.name+"-own-cpu-ns/rec")
			b.ReportMetric(median(bat), g.name+"-batch-cpu-ns/rec")
			b.ReportMetric(medianRatio(bat, own), g.name+"-batch/own-cpu")
		}
	}
}
