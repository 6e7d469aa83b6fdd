package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// releaseFeed is an input whose batches own their bytes (each batch's keys and values in an
// arena of its own, as host/pipeline's are) and are poisoned when released: every byte of the
// arena overwritten and every element made a record of a poison key. A controller that read a
// batch after releasing it would then compute from the poison (wrong keys and counts, which
// checkOutputs catches) instead of the record.
type releaseFeed struct {
	t    *testing.T
	sink *posSink

	mu       sync.Mutex
	batches  map[*Element]*fedBatch
	released int
	fed      int
}

type fedBatch struct {
	els      []Element
	arena    []byte
	released bool
}

const poisonByte = 0xEE

func newReleaseFeed(t *testing.T, sink *posSink) *releaseFeed {
	return &releaseFeed{t: t, sink: sink, batches: map[*Element]*fedBatch{}}
}

// feed sends elems in batches of batch, each a fresh copy with its own arena.
func (f *releaseFeed) feed(elems []Element, batch int) <-chan []Element {
	ch := make(chan []Element, 4)
	go func() {
		for len(elems) > 0 {
			n := min(batch, len(elems))
			fb := &fedBatch{}
			for _, e := range elems[:n] {
				off := len(fb.arena)
				fb.arena = append(append(fb.arena, e.Key...), e.Value...)
				e.Key, e.Value = fb.arena[off:off+len(e.Key)], fb.arena[off+len(e.Key):len(fb.arena)]
				fb.els = append(fb.els, e)
			}
			// The arena may have moved while it grew: re-slice every element into the final one.
			off := 0
			for i := range fb.els {
				e := &fb.els[i]
				kl, vl := len(e.Key), len(e.Value)
				e.Key, e.Value = fb.arena[off:off+kl:off+kl], fb.arena[off+kl:off+kl+vl:off+kl+vl]
				off += kl + vl
			}
			f.mu.Lock()
			f.batches[&fb.els[0]] = fb
			f.fed++
			f.mu.Unlock()
			ch <- fb.els
			elems = elems[n:]
		}
		close(ch)
	}()
	return ch
}

// release is the controller's WithInputRelease callback: it checks the batch is one of the
// feed's, released once, and that every record of it already has its output at the sink;
// then it poisons the batch.
func (f *releaseFeed) release(b []Element) {
	f.t.Helper()
	if cap(b) == 0 {
		f.t.Error("released an empty slice")
		return
	}
	f.mu.Lock()
	fb := f.batches[&b[:1][0]]
	if fb == nil {
		f.mu.Unlock()
		f.t.Errorf("released a batch the input never sent (%d elements)", len(b))
		return
	}
	if fb.released {
		f.mu.Unlock()
		f.t.Errorf("batch released twice")
		return
	}
	fb.released = true
	f.released++
	f.mu.Unlock()
	for _, e := range fb.els {
		if e.Kind == ElementRecord && !f.sink.has(e.Pos) {
			f.t.Errorf("batch released before the output of its record at %d reached the sink", e.Pos)
		}
	}
	for i := range fb.arena {
		fb.arena[i] = poisonByte
	}
	for i := range fb.els {
		fb.els[i] = Element{Kind: ElementRecord, Key: fb.arena[:min(4, len(fb.arena))], Value: fb.arena, Pos: -1}
	}
}

// posSink collects outputs (as collectSink) and the source positions that made them. With
// failAt > 0 its failAt-th Write fails, and every later one.
type posSink struct {
	collectSink
	pmu    sync.Mutex
	pos    map[int64]bool
	failAt int
	writes int
	failed bool // runner-only: Write runs on the runner
}

func (s *posSink) Write(b *Batch) error {
	if s.writes++; s.failAt > 0 && s.writes >= s.failAt {
		s.failed = true
		b.Release()
		return errSinkFull
	}
	s.pmu.Lock()
	if s.pos == nil {
		s.pos = map[int64]bool{}
	}
	for _, o := range b.Outputs {
		if o.Kind == OutputData && !o.Src.Timer {
			s.pos[o.Src.Pos] = true
		}
	}
	s.pmu.Unlock()
	return s.collectSink.Write(b)
}

func (s *posSink) has(pos int64) bool {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	return s.pos[pos]
}

// TestInputRelease runs the property workloads (random caps, coalescing, execution modes,
// fetch latencies and evictions, so records suspend and finish out of input order) with
// released batches poisoned: the outputs must still be exactly the model's, every batch must
// come back once, and only after its records' outputs reached the sink.
func TestInputRelease(t *testing.T) {
	for _, module := range []string{"testdata/accum.wasm", "testdata/accumpf.wasm", "testdata/accumb.wasm"} {
		m := loadModule(t, module)
		seeds, records := soak()
		for seed := uint64(1); seed <= seeds; seed++ {
			t.Run(fmt.Sprintf("%s/seed%d", strings.TrimSuffix(strings.TrimPrefix(module, "testdata/"), ".wasm"), seed), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					rng := rand.New(rand.NewPCG(seed, 11))
					w := genWorkload(rng, records, 1+rng.IntN(300))
					tier := newFakeTier(seed, 0, time.Duration(1+rng.IntN(3))*time.Millisecond, rng.Float64()*0.9)
					sink := &posSink{}
					f := newReleaseFeed(t, sink)
					c, err := New(m, tier, sink, WithMaxInFlight(1+rng.IntN(64)), WithCoalescing(seed%3 != 0),
						WithExecMode(ExecMode(seed%3)), WithInputRelease(f.release),
						WithOnBarrier(func(id uint64) error { _, err := tier.Capture(id); return err }))
					if err != nil {
						t.Fatal(err)
					}
					if err := c.Run(context.Background(), f.feed(w.elems, 1+rng.IntN(100))); err != nil {
						t.Fatal(err)
					}
					tier.pending.Wait()
					checkOutputs(t, w, sink.outs)
					if f.released != f.fed {
						t.Errorf("%d of %d batches released", f.released, f.fed)
					}
				})
			})
		}
	}
}

// TestInputReleaseStopsAtFailure: once a run fails (here its sink), no batch is released (an
// error or a report on its way may still alias one), and the batches whose outputs the sink
// took before were.
func TestInputReleaseStopsAtFailure(t *testing.T) {
	m := loadModule(t, "testdata/accum.wasm")
	synctest.Test(t, func(t *testing.T) {
		tier := newFakeTier(1, time.Millisecond, 2*time.Millisecond, 0)
		sink := &posSink{failAt: 6}
		f := newReleaseFeed(t, sink)
		release := func(b []Element) {
			if sink.failed {
				t.Error("a batch was released after the run failed")
			}
			f.release(b)
		}
		w := genWorkload(rand.New(rand.NewPCG(2, 2)), 2000, 50)
		c, err := New(m, tier, sink, WithMaxInFlight(16), WithInputRelease(release),
			WithOnBarrier(func(id uint64) error { _, err := tier.Capture(id); return err }))
		if err != nil {
			t.Fatal(err)
		}
		in := f.feed(w.elems, 10)
		err = c.Run(context.Background(), in)
		for range in {
		}
		tier.pending.Wait()
		if !errors.Is(err, errSinkFull) {
			t.Fatalf("Run: %v", err)
		}
		if f.released == 0 || f.released == f.fed {
			t.Errorf("%d of %d batches released: want those before the failure only", f.released, f.fed)
		}
	})
}

var errSinkFull = errors.New("sink full")
