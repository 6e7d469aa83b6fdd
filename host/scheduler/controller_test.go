package scheduler

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/state"
)

var (
	engineOnce sync.Once
	testEngine *abi.Engine
)

func engine(t testing.TB) *abi.Engine {
	engineOnce.Do(func() {
		e, err := abi.NewEngine(context.Background())
		if err != nil {
			panic(err)
		}
		testEngine = e
	})
	return testEngine
}

func loadModule(t testing.TB, path string) *abi.Module {
	t.Helper()
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := engine(t).Load(context.Background(), bin)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// out is a copied output element.
type out struct {
	kind  OutputKind
	key   string
	value []byte
	ts    int64
}

type collectSink struct {
	mu   sync.Mutex
	outs []out
}

func (s *collectSink) Write(b *Batch) error {
	s.mu.Lock()
	for _, o := range b.Outputs {
		s.outs = append(s.outs, out{o.Kind, string(o.Key), bytes.Clone(o.Value), o.TS})
	}
	s.mu.Unlock()
	b.Release()
	return nil
}

func rec(key string, i uint64, ts int64, pos int64) Element {
	v := make([]byte, 8)
	binary.LittleEndian.PutUint64(v, i)
	return Element{Kind: ElementRecord, Key: []byte(key), Value: v, TS: ts, Pos: pos}
}

// workload is a random input stream with its model.
type workload struct {
	elems    []Element
	perKey   map[string]uint64
	barriers map[uint64]map[string]uint64 // per barrier: records per key before it
}

func genWorkload(rng *rand.Rand, n, keys int) workload {
	w := workload{perKey: map[string]uint64{}, barriers: map[uint64]map[string]uint64{}}
	ts := int64(1000)
	wm := int64(math.MinInt64)
	var ckpt uint64
	for pos := int64(1); pos <= int64(n); pos++ {
		k := fmt.Sprintf("k%03d", rng.IntN(keys))
		// timestamps wander up with some disorder
		ts += rng.Int64N(20) - 5
		w.elems = append(w.elems, rec(k, w.perKey[k], ts, pos))
		w.perKey[k]++
		switch r := rng.IntN(100); {
		case r < 4:
			if nw := ts - 50; nw > wm {
				wm = nw
				w.elems = append(w.elems, Element{Kind: ElementWatermark, TS: wm})
			}
		case r == 4:
			ckpt++
			snap := map[string]uint64{}
			for k, c := range w.perKey {
				snap[k] = c
			}
			w.barriers[ckpt] = snap
			w.elems = append(w.elems, Element{Kind: ElementBarrier, CheckID: ckpt})
		}
	}
	w.elems = append(w.elems, Element{Kind: ElementWatermark, TS: math.MaxInt64})
	return w
}

func feed(elems []Element, batch int) <-chan []Element {
	ch := make(chan []Element, 4)
	go func() {
		for len(elems) > 0 {
			n := min(batch, len(elems))
			ch <- elems[:n]
			elems = elems[n:]
		}
		close(ch)
	}()
	return ch
}

// TestPropertiesRandomLatency is the randomized property test of issue 3: random workloads,
// random in-flight caps, coalescing on and off, fetch latencies in random order, random
// evictions. It checks per-key order and read-your-writes, no lost or duplicated records,
// watermarks never overtaking earlier records, timers firing after the records before them,
// and barriers seeing a consistent cut.
func TestPropertiesRandomLatency(t *testing.T) {
	testProperties(t, "testdata/accum.wasm", false)
}

// TestPropertiesPrefetch runs the same properties with the fast paths: the count is a prefetched
// value written back through its frame, outputs go through the output area. Cold values are
// loaded before calls start, so nothing suspends.
func TestPropertiesPrefetch(t *testing.T) {
	testProperties(t, "testdata/accumpf.wasm", true)
}

// soak scales the randomized tests: CLINK_SOAK=1 (make soak) runs many more seeds and records.
func soak() (seeds uint64, records int) {
	if os.Getenv("CLINK_SOAK") != "" {
		return 300, 6000
	}
	return 12, 1500
}

func testProperties(t *testing.T, module string, prefetch bool) {
	m := loadModule(t, module)
	seeds, records := soak()
	// What one instance costs, for the seeds that run with a budget of a few instances (records
	// then wait for one, and spare instances are made within it).
	probe, err := New(m, newFakeTier(1, 0, 0, 0), &collectSink{})
	if err != nil {
		t.Fatal(err)
	}
	if err := probe.Run(context.Background(), feed(nil, 1)); err != nil {
		t.Fatal(err)
	}
	cost := probe.nextCost
	for seed := uint64(1); seed <= seeds; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 7))
				w := genWorkload(rng, records, 1+rng.IntN(300))
				evict := rng.Float64() * 0.9
				if seed%4 == 0 {
					evict = 0
				}
				tier := newFakeTier(seed, 0, time.Duration(1+rng.IntN(3))*time.Millisecond, evict)
				sink := &collectSink{}
				var barrierErr error
				maxInFlight := 1 + rng.IntN(64)
				coalesce := seed%3 != 0
				mode := ExecMode(seed % 3)
				capture := seed%2 == 0
				var captured int
				onBarrier := func(id uint64) error {
					// Consistent cut: state must count exactly the records before the barrier,
					// less those the barrier captured (with capture), which must be each key's
					// last ones before it, in order.
					if err := checkCut(tier, w.barriers[id], id, &captured); err != nil && barrierErr == nil {
						barrierErr = err
					}
					_, err := tier.Capture(id)
					return err
				}
				opts := []Option{WithMaxInFlight(maxInFlight), WithCoalescing(coalesce),
					WithResumeOrder(ResumeOrder(seed % 2)), WithExecMode(mode), WithOnBarrier(onBarrier),
					WithBarrierCapture(captureIf(capture))}
				budget := 0 // instances, when the seed limits them
				if seed%5 == 1 {
					budget = 1 + rng.IntN(6)
					opts = append(opts, WithInstanceMemoryBudget(int64(budget)*cost+cost/2))
				}
				c, err := New(m, tier, sink, opts...)
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Run(context.Background(), feed(w.elems, 1+rng.IntN(100))); err != nil {
					t.Fatal(err)
				}
				tier.pending.Wait()
				if barrierErr != nil {
					t.Fatal(barrierErr)
				}
				checkOutputs(t, w, sink.outs)
				s := c.Metrics()
				if s.Instances != 0 || s.InFlight != 0 || s.Parked != 0 {
					t.Errorf("leftovers after Run: %+v", s)
				}
				if prefetch {
					// Prefetched values load before calls start. Only a value evicted between
					// its load and its call is read inside the call (and suspends): never when
					// the tier does not evict.
					if s.PrefetchWaits == 0 || (tier.evictP == 0 && s.Suspensions != 0) {
						t.Errorf("prefetch: %d suspensions, %d prefetch waits", s.Suspensions, s.PrefetchWaits)
					}
				} else if s.Suspensions == 0 {
					t.Errorf("nothing suspended: %+v", s)
				}
				// Batching needs something to batch: a workload whose keys all stay hot after their
				// first read makes a handful of cold reads in all.
				// (A budget of a few instances allows only that many suspended reads at once.)
				if coalesce && maxInFlight > 8 && (budget == 0 || budget > 8) && s.ReadBatchKeys >= 100 && s.MeanReadBatch < 1.5 {
					t.Errorf("coalescing did not batch: mean %.2f keys per read", s.MeanReadBatch)
				}
				if mode == ExecCoroutine && s.CoroutineCalls == 0 || mode == ExecDirect && s.CoroutineCalls != 0 {
					t.Errorf("mode %d: %d coroutine calls", mode, s.CoroutineCalls)
				}
				// A call that returns takes the next input into its coroutine (chain) whenever
				// the runner would take it next: not every call is entered from the runner.
				if mode == ExecCoroutine && c.coEnters >= s.CoroutineCalls {
					t.Errorf("all %d coroutine calls entered from the runner (%d): none chained", s.CoroutineCalls, c.coEnters)
				}
				if !capture && captured != 0 || s.CaptureFallbacks != 0 {
					t.Errorf("capture %v: %d records captured, %d fallbacks", capture, captured, s.CaptureFallbacks)
				}
				t.Logf("capture %v: %d records captured at %d barriers", capture, captured, s.Barriers)
				t.Logf("cap %d budget %d coalesce %v mode %d: %d suspensions (%d coroutine calls, %d entered from the runner), %d gate waits, %d read batches (mean %.1f keys), %d timers",
					maxInFlight, budget, coalesce, mode, s.Suspensions, s.CoroutineCalls, c.coEnters, s.GateWaits, s.ReadBatches, s.MeanReadBatch, s.Timers)
			})
		})
	}
}

func checkOutputs(t *testing.T, w workload, outs []out) {
	t.Helper()
	// Position of each record in the input, and of each watermark.
	type rk struct {
		key string
		i   uint64
	}
	inputIdx := map[rk]int{}
	wmIdx := map[int64]int{}
	for i, e := range w.elems {
		switch e.Kind {
		case ElementRecord:
			inputIdx[rk{string(e.Key), binary.LittleEndian.Uint64(e.Value)}] = i
		case ElementWatermark:
			wmIdx[e.TS] = i
		}
	}
	seen := map[rk]int{} // output index
	nextI := map[string]uint64{}
	lastWM := int64(math.MinInt64)
	timersSeen := 0
	firedSince := int64(math.MinInt64) // latest timer time fired since the last watermark out
	for oi, o := range outs {
		switch o.kind {
		case OutputWatermark:
			if o.ts <= lastWM {
				t.Fatalf("watermark %d after %d", o.ts, lastWM)
			}
			// A timer fires only while a watermark at or past it is being released, and that
			// watermark is forwarded after its timers: the next one out must cover them.
			if firedSince > o.ts {
				t.Fatalf("a timer at %d fired before watermark %d (the next one out) reached it", firedSince, o.ts)
			}
			firedSince = math.MinInt64
			lastWM = o.ts
			// Every record that arrived before this watermark must already be out.
			for r, idx := range inputIdx {
				if idx < wmIdx[o.ts] {
					if _, ok := seen[r]; !ok {
						t.Fatalf("watermark %d overtook record %v (input %d)", o.ts, r, idx)
					}
				}
			}
		case OutputData:
			i := int64(binary.LittleEndian.Uint64(o.value))
			if i == -1 {
				timersSeen++
				firedSince = max(firedSince, int64(binary.LittleEndian.Uint64(o.value[8:])))
				continue
			}
			n := binary.LittleEndian.Uint64(o.value[8:])
			r := rk{o.key, uint64(i)}
			if _, dup := seen[r]; dup {
				t.Fatalf("record %v emitted twice", r)
			}
			seen[r] = oi
			if uint64(i) != nextI[o.key] {
				t.Fatalf("key %s: record %d out of order (expected %d)", o.key, i, nextI[o.key])
			}
			nextI[o.key]++
			if n != uint64(i) {
				t.Fatalf("key %s record %d read count %d: read-your-writes broken", o.key, i, n)
			}
		}
	}
	for k, c := range w.perKey {
		if nextI[k] != c {
			t.Fatalf("key %s: %d records out, %d in (lost records)", k, nextI[k], c)
		}
	}
	if timersSeen == 0 {
		t.Fatal("no timer fired")
	}
	if firedSince != math.MinInt64 {
		t.Fatalf("a timer at %d fired after the last watermark", firedSince)
	}
	checkTimers(t, w, outs)
}

// checkTimers: a timer (key, ts) fires after every record of that key whose timestamp is <= ts
// and which arrived before the watermark that released the timer, and its count reflects them.
func checkTimers(t *testing.T, w workload, outs []out) {
	t.Helper()
	emittedAt := map[string]int{} // key/i -> output index
	for oi, o := range outs {
		if o.kind == OutputData {
			if i := int64(binary.LittleEndian.Uint64(o.value)); i >= 0 {
				emittedAt[fmt.Sprint(o.key, "/", i)] = oi
			}
		}
	}
	// For each watermark, the records before it in input.
	var wmPos []int
	var wms []int64
	for i, e := range w.elems {
		if e.Kind == ElementWatermark {
			wmPos = append(wmPos, i)
			wms = append(wms, e.TS)
		}
	}
	for oi, o := range outs {
		if o.kind != OutputData || int64(binary.LittleEndian.Uint64(o.value)) != -1 {
			continue
		}
		ts := int64(binary.LittleEndian.Uint64(o.value[8:]))
		// The releasing watermark is the first with TS >= ts.
		var rel int = -1
		for j, wm := range wms {
			if wm >= ts {
				rel = wmPos[j]
				break
			}
		}
		if rel < 0 {
			t.Fatalf("timer %s@%d fired with no watermark at or past it", o.key, ts)
		}
		idx := 0
		for _, e := range w.elems[:rel] {
			if e.Kind == ElementRecord && string(e.Key) == o.key {
				at, ok := emittedAt[fmt.Sprint(o.key, "/", idx)]
				if !ok || at > oi {
					t.Fatalf("timer %s@%d fired before record %d of its key", o.key, ts, idx)
				}
				idx++
			}
		}
		if n := binary.LittleEndian.Uint64(o.value[16:]); n < uint64(idx) {
			t.Fatalf("timer %s@%d saw count %d, want >= %d", o.key, ts, n, idx)
		}
	}
}

// TestCancellationLeaksNothing cancels a run with many calls suspended on slow reads. synctest
// fails the test if any goroutine (carrier, timer) outlives it.
func TestCancellationLeaksNothing(t *testing.T) {
	m := loadModule(t, "testdata/accum.wasm")
	synctest.Test(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 3))
		w := genWorkload(rng, 3000, 500)
		tier := newFakeTier(3, 50*time.Millisecond, 100*time.Millisecond, 0)
		ctx, cancel := context.WithCancel(context.Background())
		c, err := New(m, tier, &collectSink{}, WithMaxInFlight(256), WithExecMode(ExecCoroutine))
		if err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(120*time.Millisecond, cancel)
		in := feed(w.elems, 64)
		err = c.Run(ctx, in)
		undone := tier.undone.Load() // at Run's return: every fetch it issued has delivered
		for range in {               // the source stops once drained
		}
		if err == nil || !strings.Contains(err.Error(), "cancelled") {
			t.Fatalf("Run: %v", err)
		}
		if undone != 0 {
			t.Errorf("Run returned with %d fetches still to deliver", undone)
		}
		tier.pending.Wait()
		s := c.Metrics()
		if s.Instances != 0 {
			t.Errorf("%d instances leaked", s.Instances)
		}
		if s.Suspensions == 0 {
			t.Error("nothing was suspended when cancelled: the test did not test anything")
		}
	})
}

// TestFaultReleasesKeyAndFails checks a trapping record: the run fails with an OperatorError
// naming the operator, position and key, and stops without leaking.
func TestFaultNamesRecord(t *testing.T) {
	m := loadModule(t, "../abi/testdata/trap.wasm")
	synctest.Test(t, func(t *testing.T) {
		c, err := New(m, state.NewMemory(), &collectSink{}, WithDescribe(func(pos int64) string { return fmt.Sprintf("input line %d", pos) }))
		if err != nil {
			t.Fatal(err)
		}
		err = c.Run(context.Background(), feed([]Element{rec("user-7", 0, 5, 42)}, 1))
		var oe *OperatorError
		if !errors.As(err, &oe) {
			t.Fatalf("want OperatorError, got %v", err)
		}
		for _, w := range []string{`operator "trapper"`, "input line 42", `key "user-7"`, "unreachable", `guest said: "negative amount"`} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q does not mention %q", err, w)
			}
		}
	})
}

// TestFetchErrorFailsPipeline: a failed remote read fails the run; suspended calls are aborted.
func TestFetchErrorFailsPipeline(t *testing.T) {
	m := loadModule(t, "testdata/accum.wasm")
	synctest.Test(t, func(t *testing.T) {
		tier := newFakeTier(1, time.Millisecond, 2*time.Millisecond, 0)
		tier.fetchErr = errors.New("s3: connection refused")
		c, err := New(m, tier, &collectSink{}, WithMaxInFlight(8))
		if err != nil {
			t.Fatal(err)
		}
		w := genWorkload(rand.New(rand.NewPCG(1, 1)), 100, 20)
		in := feed(w.elems, 10)
		err = c.Run(context.Background(), in)
		for range in {
		}
		if err == nil || !strings.Contains(err.Error(), "s3: connection refused") {
			t.Fatalf("Run: %v", err)
		}
		tier.pending.Wait()
	})
}

// TestBackpressure: at the cap the runner stops pulling input (with no room for records to
// wait beyond it: TestWaitingMemoryBounded covers the bound on those).
func TestBackpressure(t *testing.T) {
	m := loadModule(t, "testdata/accum.wasm")
	synctest.Test(t, func(t *testing.T) {
		tier := newFakeTier(1, 10*time.Millisecond, 10*time.Millisecond, 0)
		c, err := New(m, tier, &collectSink{}, WithMaxInFlight(4), WithWaitingMemory(-1))
		if err != nil {
			t.Fatal(err)
		}
		in := make(chan []Element) // unbuffered: every receive is visible
		done := make(chan error)
		go func() { done <- c.Run(context.Background(), in) }()
		// Every read is cold and takes 10 ms (of the bubble's clock). The first 4 records are
		// admitted at once; then all 4 are suspended and the runner must stop taking input.
		for i := range 4 {
			in <- []Element{rec(fmt.Sprint("key", i), 0, 1, int64(i))}
		}
		synctest.Wait() // the runner and the fetches are blocked: nothing can move until time does
		select {
		case in <- []Element{rec("key4", 0, 1, 4)}:
			t.Fatal("a 5th record was admitted while 4 were in flight at a cap of 4")
		default:
		}
		if got := c.Metrics().InFlight; got != 4 {
			t.Errorf("in flight %d at the cap, want 4", got)
		}
		// time.Now is the bubble's fake clock here: it moves only when every goroutine of the
		// bubble is blocked, so the wait below is exact, not a wall-clock measurement.
		start := time.Now()
		in <- []Element{rec("key4", 0, 1, 4)}
		if waited := time.Since(start); waited < 10*time.Millisecond {
			t.Errorf("the 5th record was admitted after %v, before any read completed", waited)
		}
		for i := 5; i < 20; i++ {
			in <- []Element{rec(fmt.Sprint("key", i), 0, 1, int64(i))}
		}
		close(in)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		tier.pending.Wait()
	})
}

// TestSetMaxInFlight: a cap changed while the controller runs (a live quota) applies at the
// runner's next iteration: lowered, it admits no more than the new cap; raised, more at once.
func TestSetMaxInFlight(t *testing.T) {
	m := loadModule(t, "testdata/accum.wasm")
	synctest.Test(t, func(t *testing.T) {
		tier := newFakeTier(1, 10*time.Millisecond, 10*time.Millisecond, 0)
		c, err := New(m, tier, &collectSink{}, WithMaxInFlight(4), WithWaitingMemory(-1))
		if err != nil {
			t.Fatal(err)
		}
		in := make(chan []Element)
		done := make(chan error)
		go func() { done <- c.Run(context.Background(), in) }()
		c.SetMaxInFlight(2)
		for i := range 2 {
			in <- []Element{rec(fmt.Sprint("key", i), 0, 1, int64(i))}
		}
		synctest.Wait()
		select {
		case in <- []Element{rec("key2", 0, 1, 2)}:
			t.Fatal("a 3rd record was admitted at a cap lowered to 2")
		default:
		}
		c.SetMaxInFlight(8)
		for i := 2; i < 8; i++ {
			in <- []Element{rec(fmt.Sprint("key", i), 0, 1, int64(i))}
		}
		synctest.Wait()
		if got := c.Metrics().InFlight; got != 6 {
			t.Errorf("in flight %d after raising the cap to 8 and sending 6 more, want 6", got)
		}
		if got := c.MaxInFlight(); got != 8 {
			t.Errorf("MaxInFlight %d, want 8", got)
		}
		close(in)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		tier.pending.Wait()
	})
}

// TestResumePriority: records whose reads land in one coalesced batch resume in order-key order
// when the pipeline asks for priority resumption, and in arrival order otherwise.
func TestResumePriority(t *testing.T) {
	m := loadModule(t, "testdata/prio.wasm")
	orders := []uint64{50, 10, 40, 20, 30}
	run := func(order ResumeOrder) []uint64 {
		var got []uint64
		synctest.Test(t, func(t *testing.T) {
			tier := newFakeTier(1, 5*time.Millisecond, 5*time.Millisecond, 0)
			sink := &collectSink{}
			c, err := New(m, tier, sink, WithMaxInFlight(16), WithResumeOrder(order))
			if err != nil {
				t.Fatal(err)
			}
			var els []Element
			for i, o := range orders {
				els = append(els, rec(fmt.Sprint("k", i), o, 0, int64(i)))
			}
			if err := c.Run(context.Background(), feed(els, len(els))); err != nil {
				t.Fatal(err)
			}
			tier.pending.Wait()
			if s := c.Metrics(); s.ReadBatches != 1 {
				t.Fatalf("want the five reads in one batch, got %d batches", s.ReadBatches)
			}
			for _, o := range sink.outs {
				if o.kind == OutputData {
					got = append(got, binary.LittleEndian.Uint64(o.value))
				}
			}
		})
		return got
	}
	if got := run(ResumePriority); fmt.Sprint(got) != "[10 20 30 40 50]" {
		t.Errorf("priority order: %v", got)
	}
	if got := run(ResumeFIFO); fmt.Sprint(got) != fmt.Sprint(orders) {
		t.Errorf("fifo order: %v", got)
	}
}
