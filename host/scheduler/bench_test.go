package scheduler

// Benchmarks for the figures issues 2 and 3 hold the host to. Each prints ratios measured side
// by side in one run, since absolute times on a shared 2-core machine are noise:
//
//	go test ./host/scheduler -run '^$' -bench . -benchtime 1x
//
// BenchmarkCounterNativeVsWasm  native Go counter vs the AssemblyScript and Go guest counters
// BenchmarkHotPath              all hits: controller vs a plain synchronous loop (target <= 1.10x, issue 11)
// BenchmarkColdPath             50% cold reads at 2 ms, 512 in flight (targets: >= 85% of the
//                               Little's-law bound, >= 200x synchronous, >= 10 keys per read)
// BenchmarkEnrichPath           the whole enrichment path through a real lookup endpoint and a
//                               loopback upstream in its own process (enrich_bench_test.go)

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/jsonx"
	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/state"
)

const (
	counterAS = "../../examples/wasm/counter/counter-as.wasm"
	counterGo = "../../examples/wasm/counter/counter-go.wasm"
)

// benchRecords returns n records over keys distinct keys, as JSON values like the example's.
func benchRecords(n, keys int) []Element {
	rng := rand.New(rand.NewPCG(1, 2))
	els := make([]Element, n)
	for i := range els {
		k := "user-" + strconv.Itoa(rng.IntN(keys))
		v := fmt.Sprintf(`{"user":%q,"seq":%d,"page":"/checkout"}`, k, i)
		els[i] = Element{Kind: ElementRecord, Key: []byte(k), Value: []byte(v), TS: int64(i), Pos: int64(i + 1)}
	}
	return els
}

// plainHandler serves a single instance the simplest possible way: the synchronous path the
// controller is compared against. Emits go through the same output batching and sink as the
// controller's, so the comparison isolates the controller (gate, epochs, suspension).
type plainHandler struct {
	backend state.Backend
	key     []byte
	pos, ts int64
	out     *outBuffer
}

func (h *plainHandler) Get(s uint32, e []byte) ([]byte, bool, error) {
	v, ok, _ := h.backend.Get(state.Key{State: state.StateID(s), Record: h.key, Entry: e})
	return v, ok, nil
}
func (h *plainHandler) Put(s uint32, e, v []byte) error {
	h.backend.Put(state.Key{State: state.StateID(s), Record: h.key, Entry: e}, v)
	return nil
}
func (h *plainHandler) Delete(s uint32, e []byte) error {
	h.backend.Delete(state.Key{State: state.StateID(s), Record: h.key, Entry: e})
	return nil
}
func (h *plainHandler) Emit(k, v []byte) error {
	return h.out.emit(k, v, h.ts, Source{Pos: h.pos, Key: h.key, TS: h.ts})
}
func (h *plainHandler) RegisterTimer(int64) error { return nil }
func (h *plainHandler) DeleteTimer(int64) error   { return nil }
func (h *plainHandler) Watermark() int64          { return math.MinInt64 }
func (h *plainHandler) Lookup(uint32, []byte) (int, []byte, error) {
	return 0, nil, abi.LookupUnavailable
}
func (h *plainHandler) Log(abi.LogLevel, []byte) {}
func (h *plainHandler) SetResumeOrder(int64)     {}

// cost is what a benchmark run took: wall-clock time, and the CPU time of the benchmark's
// thread (see threadCPU). CPU time does not count the time the OS ran other processes, so the
// ratios of CPU times hold better than wall-clock ratios on a loaded machine.
type cost struct{ wall, cpu time.Duration }

type span struct {
	wall time.Time
	cpu  time.Duration
}

func startSpan() span { return span{time.Now(), threadCPU()} }

func (s span) end() cost { return cost{time.Since(s.wall), threadCPU() - s.cpu} }

// onThread runs f with the calling goroutine locked to its OS thread, so that threadCPU
// measures it.
func onThread(f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	f()
}

// runPlain processes records on one instance in a plain loop and returns the time taken.
// With setup, the time runs from instantiation to close, as runController measures a
// controller's Run; without, it covers the records only (per-record cost).
func runPlain(b *testing.B, m *abi.Module, els []Element) cost {
	return runPlainSetup(b, m, els, false)
}

func runPlainSetup(b *testing.B, m *abi.Module, els []Element, setup bool) cost {
	start := startSpan()
	h := &plainHandler{backend: state.NewMemory(), out: newOutBuffer(&discardSink{})}
	in, err := m.Instantiate(context.Background(), h)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close(context.Background())
	if !setup {
		start = startSpan()
	}
	for i := range els {
		h.key, h.pos, h.ts = els[i].Key, els[i].Pos, els[i].TS
		if err := in.Process(els[i].Key, els[i].Value, els[i].TS); err != nil {
			b.Fatal(err)
		}
	}
	h.out.flush()
	if setup {
		if err := in.Close(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	return start.end()
}

// runNative is the counter example written as plain Go against the same backend and output
// path, with the same JSON escaping as the SDKs (jsonx): the baseline for "what does running
// it as Wasm cost".
func runNative(els []Element) cost {
	be := state.NewMemory()
	out := newOutBuffer(&discardSink{}) // the engine's output path, as the guests use it
	var js []byte
	var num [8]byte
	start := startSpan()
	for i := range els {
		k := state.Key{Record: els[i].Key}
		var n int64
		if v, ok, _ := be.Get(k); ok && len(v) == 8 {
			n = int64(leU64(v))
		}
		n++
		putLE(num[:], uint64(n))
		be.Put(k, num[:])
		js = append(js[:0], `{"key":`...)
		js = jsonx.AppendString(js, els[i].Key)
		js = append(js, `,"count":`...)
		js = strconv.AppendInt(js, n, 10)
		js = append(js, '}')
		out.emit(els[i].Key, js, els[i].TS, Source{Pos: els[i].Pos, Key: els[i].Key, TS: els[i].TS})
	}
	out.flush()
	return start.end()
}

func leU64(b []byte) uint64 {
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

func putLE(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}

// BenchmarkCounterNativeVsWasm: issue 2's "per-record host overhead for the counter example on
// the Go and AssemblyScript guests, next to a native Go implementation". Target: the
// AssemblyScript counter at >= 0.5x native throughput.
func BenchmarkCounterNativeVsWasm(b *testing.B) {
	as := loadModule(b, counterAS)
	gom := loadModule(b, counterGo)
	els := benchRecords(50_000, 10_000)
	for b.Loop() {
		var nat, asT, goT, natC, asC, goC []float64
		var asB, goB, asBC, goBC []float64 // through clink_process_batch (batch.go)
		add := func(wall, cpu *[]float64, c cost) {
			*wall, *cpu = append(*wall, perRec(c.wall, len(els))), append(*cpu, perRec(c.cpu, len(els)))
		}
		onThread(func() {
			for r := range 11 {
				// Alternate the order each round; a noisy neighbour then hits every variant
				// alike, and the median of per-round ratios is what we report.
				runs := []func(){
					func() { add(&nat, &natC, runNative(els)) },
					func() { add(&asT, &asC, runPlain(b, as, els)) },
					func() { add(&goT, &goC, runPlain(b, gom, els)) },
					func() { add(&goB, &goBC, runPlainBatch(b, gom, els, DefaultCallBatch)) },
				}
				if as.HasBatch() { // opt-in for AssemblyScript modules (guest-sdk/assemblyscript)
					runs = append(runs, func() { add(&asB, &asBC, runPlainBatch(b, as, els, DefaultCallBatch)) })
				}
				if r%2 == 1 {
					slices.Reverse(runs)
				}
				for _, f := range runs {
					f()
				}
			}
		})
		b.ReportMetric(median(nat), "native-ns/rec")
		b.ReportMetric(median(asT), "as-ns/rec")
		b.ReportMetric(median(goT), "go-ns/rec")
		b.ReportMetric(median(asT)-median(nat), "as-host-overhead-ns/rec")
		b.ReportMetric(medianRatio(nat, asT), "as/native-throughput")
		b.ReportMetric(medianRatio(nat, goT), "go/native-throughput")
		// The same ratios in the thread's CPU time (time the OS gave other processes is not
		// counted): what holds on a loaded machine.
		b.ReportMetric(medianRatio(natC, asC), "as/native-cpu")
		b.ReportMetric(medianRatio(natC, goC), "go/native-cpu")
		// Through batch calls of DefaultCallBatch records, as the controller makes them on the
		// all-hits path for modules that export clink_process_batch (both SDKs do).
		if len(asBC) > 0 {
			b.ReportMetric(medianRatio(natC, asBC), "as-batch/native-cpu")
		}
		b.ReportMetric(medianRatio(natC, goBC), "go-batch/native-cpu")
	}
}

func perRec(d time.Duration, n int) float64 { return float64(d.Nanoseconds()) / float64(n) }

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// medianRatio is the median over rounds of num[i]/den[i].
func medianRatio(num, den []float64) float64 {
	r := make([]float64, len(num))
	for i := range num {
		r[i] = num[i] / den[i]
	}
	return median(r)
}

type discardSink struct{ outputs atomic.Int64 }

func (s *discardSink) Write(b *Batch) error {
	s.outputs.Add(int64(len(b.Outputs)))
	b.Release()
	return nil
}

// runController pushes els through a controller and returns the time from the first record to
// the end of Run.
func runController(b *testing.B, m *abi.Module, be state.Backend, els []Element, opts ...Option) (time.Duration, *Controller) {
	return runControllerTo(b, m, be, &discardSink{}, els, opts...)
}

// runControllerTo is runController with the outputs going to sink.
func runControllerTo(b *testing.B, m *abi.Module, be state.Backend, sink Sink, els []Element, opts ...Option) (time.Duration, *Controller) {
	c, err := New(m, be, sink, opts...)
	if err != nil {
		b.Fatal(err)
	}
	// Pre-batch the input, as the pipeline's source does, so the benchmark measures the
	// controller rather than the feeder.
	ch := make(chan []Element, len(els)/256+2)
	for i := 0; i < len(els); i += 256 {
		ch <- els[i:min(i+256, len(els))]
	}
	close(ch)
	start := time.Now()
	if err := c.Run(context.Background(), ch); err != nil {
		b.Fatal(err)
	}
	return time.Since(start), c
}

// BenchmarkHotPath: every read hits. The controller (per-key gate, epochs, suspension-capable
// imports, output batching) against a plain loop on one instance. Target <= 1.10x (issue 11).
func BenchmarkHotPath(b *testing.B) {
	m := loadModule(b, counterAS)
	els := benchRecords(50_000, 10_000)
	ctrl := func() cost {
		// Run's runner is this goroutine while no call suspends (every read hits), so the
		// thread's CPU time is the controller's.
		cpu0 := threadCPU()
		d, _ := runController(b, m, state.NewMemory(), els)
		return cost{d, threadCPU() - cpu0}
	}
	for b.Loop() {
		var plain, async, plainC, asyncC []float64
		add := func(wall, cpu *[]float64, c cost) {
			*wall, *cpu = append(*wall, perRec(c.wall, len(els))), append(*cpu, perRec(c.cpu, len(els)))
		}
		onThread(func() {
			for r := range 15 {
				if r%2 == 0 {
					add(&plain, &plainC, runPlainSetup(b, m, els, true))
					add(&async, &asyncC, ctrl())
				} else {
					add(&async, &asyncC, ctrl())
					add(&plain, &plainC, runPlainSetup(b, m, els, true))
				}
			}
		})
		b.ReportMetric(median(plain), "sync-ns/rec")
		b.ReportMetric(median(async), "async-ns/rec")
		b.ReportMetric(medianRatio(async, plain), "async/sync-cost")
		b.ReportMetric(medianRatio(asyncC, plainC), "async/sync-cpu")
	}
}

// coldTier is the benchmark's remote tier: a hot tier (one map, one lookup per operation, like
// the real one) in which each record finds its key cold with probability missRate; cold keys
// are served by a batched Fetch after a fixed latency, one timer per batch. Values are captured
// when the fetch is issued (on the runner, where the per-key gate guarantees no concurrent
// write to those keys) and delivered after the latency.
type coldTier struct {
	rng      *rand.Rand
	missRate float64
	latency  time.Duration
	m        map[string]*coldEntry
	scratch  []byte
	opState  map[string][]byte

	mu         sync.Mutex
	batches    int64
	keys       int64
	latencySum time.Duration
}

// coldEntry is one key. decided: the record now reading the key found it hot (or had it
// fetched); the next record, after a write, rolls the dice again.
type coldEntry struct {
	v       []byte
	found   bool
	decided bool
}

func newColdTier(missRate float64, latency time.Duration) *coldTier {
	return &coldTier{rng: rand.New(rand.NewPCG(9, 9)), missRate: missRate, latency: latency,
		m: map[string]*coldEntry{}, opState: map[string][]byte{}}
}

func (t *coldTier) entry(k state.Key) *coldEntry {
	// The benchmark's operators keep one per-key value (state 0, entry ""): key those by the
	// record key alone, as a hot tier specialised for them would; anything else by the full key.
	kb := k.Record
	if k.State != 0 || len(k.Entry) != 0 {
		t.scratch = state.AppendKey(append(t.scratch[:0], 0xFF), k)
		kb = t.scratch
	}
	e := t.m[string(kb)]
	if e == nil {
		e = &coldEntry{}
		t.m[string(kb)] = e
	}
	return e
}

func (t *coldTier) Open([]string) error { return nil }

func (t *coldTier) Get(k state.Key) ([]byte, bool, bool) {
	e := t.entry(k)
	if !e.decided {
		if t.rng.Float64() < t.missRate {
			return nil, false, false
		}
		e.decided = true
	}
	return e.v, e.found, true
}

func (t *coldTier) Put(k state.Key, v []byte) {
	e := t.entry(k)
	e.v, e.found, e.decided = append(e.v[:0], v...), true, false
}

func (t *coldTier) Delete(k state.Key) {
	e := t.entry(k)
	e.v, e.found, e.decided = e.v[:0], false, false
}

func (t *coldTier) Fill(res []state.Fetched) {
	for _, r := range res {
		t.entry(r.Key).decided = true
	}
}

func (t *coldTier) Fetch(keys []state.Key, done func([]state.Fetched, error)) {
	res := make([]state.Fetched, len(keys))
	for i, k := range keys {
		e := t.entry(k)
		res[i] = state.Fetched{Key: k, Value: bytes.Clone(e.v), Found: e.found}
	}
	issued := time.Now()
	time.AfterFunc(t.latency, func() {
		t.mu.Lock()
		t.batches++
		t.keys += int64(len(keys))
		t.latencySum += time.Since(issued)
		t.mu.Unlock()
		done(res, nil)
	})
}

func (t *coldTier) SetOperatorState(name string, data []byte) { t.opState[name] = data }
func (t *coldTier) OperatorState(name string) []byte          { return t.opState[name] }
func (t *coldTier) Capture(uint64) (state.Snapshot, error)    { return nilSnapshot{}, nil }
func (t *coldTier) Close() error                              { return nil }

func (t *coldTier) meanLatency() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.batches == 0 {
		return 0
	}
	return t.latencySum / time.Duration(t.batches)
}

// spanSink counts outputs and notes when their count first reached from and to: the rate
// between the two is the run's steady rate, without its ramp-up (the first instances, made
// while the first records wait for them) and its end (the last fetches, closing the
// instances). It runs on the runner.
type spanSink struct {
	from, to     int64
	outputs      int64
	fromAt, toAt time.Time
}

func (s *spanSink) Write(b *Batch) error {
	n := s.outputs + int64(len(b.Outputs))
	if s.outputs < s.from && n >= s.from {
		s.fromAt = time.Now()
	}
	if s.outputs < s.to && n >= s.to {
		s.toAt = time.Now()
	}
	s.outputs = n
	b.Release()
	return nil
}

// rate is the outputs per second between from and to, or 0 if the run did not reach to.
func (s *spanSink) rate() float64 {
	if s.toAt.IsZero() || !s.toAt.After(s.fromAt) {
		return 0
	}
	return float64(s.to-s.from) / s.toAt.Sub(s.fromAt).Seconds()
}

// coldPath runs issue 3's cold-path workload on module m and reports its figures.
func coldPath(b *testing.B, m *abi.Module, records, syncRecords int) {
	const (
		keys     = 10_000
		missRate = 0.5
		latency  = 2 * time.Millisecond
		inFlight = 512
	)
	els := benchRecords(records, keys)
	for b.Loop() {
		tier := newColdTier(missRate, latency)
		gc0 := gcCycles()
		cpu0 := processCPU()
		// Every guest here emits one output per record: the middle 60% of the outputs give
		// the steady rate.
		sink := &spanSink{from: int64(len(els)) / 5, to: int64(len(els)) * 4 / 5}
		d, c := runControllerTo(b, m, tier, sink, els, WithMaxInFlight(inFlight), WithReadBatch(readBatchEnv(), 0))
		cpu := processCPU() - cpu0
		gcs := gcCycles() - gc0
		s := c.Metrics()
		achieved := float64(len(els)) / d.Seconds()
		// The miss rate is what the remote tier actually served per record: reads inside
		// calls and prefetched values alike.
		tier.mu.Lock()
		measuredMiss := float64(tier.keys) / float64(len(els))
		tier.mu.Unlock()
		lat := tier.meanLatency()
		bound := float64(inFlight) / (measuredMiss * lat.Seconds())

		syncTier := newColdTier(missRate, latency)
		sd, _ := runController(b, m, syncTier, els[:syncRecords], WithSynchronous(true))
		syncRate := float64(syncRecords) / sd.Seconds()

		b.ReportMetric(achieved, "async-rec/s")
		b.ReportMetric(bound, "littles-law-bound-rec/s")
		b.ReportMetric(achieved/bound, "achieved/bound")
		// The same for the steady part of the run (spanSink): what the whole run's figure
		// loses to its start and its end is the difference.
		b.ReportMetric(sink.rate()/bound, "steady-achieved/bound")
		// The process's CPU over the async run: per record, and in cores. At the bound the
		// run needs bound × cpu/rec cores; when the cores it got are about what a loaded
		// machine leaves it, the run was CPU-bound, not held back by the mechanism.
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(len(els))/1e3, "cpu-µs/rec")
		b.ReportMetric(cpu.Seconds()/d.Seconds(), "cores-used")
		b.ReportMetric(bound*cpu.Seconds()/float64(len(els)), "cores-needed-at-bound")
		b.ReportMetric(syncRate, "sync-rec/s")
		b.ReportMetric(achieved/syncRate, "async/sync")
		b.ReportMetric(s.MeanReadBatch, "keys/remote-read")
		b.ReportMetric(measuredMiss, "miss-rate")
		b.ReportMetric(float64(lat.Microseconds()), "measured-latency-us")
		b.ReportMetric(float64(s.ResumeLatency.Nanoseconds()), "resume-latency-ns")
		b.ReportMetric(float64(s.Suspensions)/float64(len(els)), "suspensions/rec")
		if s.CoroutineCalls > 0 {
			// The calls the runner entered a coroutine for; the rest a coroutine took itself
			// after its last call returned (chain, coro.go).
			b.ReportMetric(float64(c.coEnters)/float64(s.CoroutineCalls), "runner-entered/coro-call")
		}
		// What an in-flight record costs: a record suspended inside its call holds an
		// instance; one waiting for a prefetched value holds only its task.
		b.ReportMetric(float64(s.PeakInstances), "peak-instances")
		// The share of the run the runner waited for something to do: near 0, the run was
		// bound by the runner's CPU per record, not by the mechanism's waits.
		b.ReportMetric(s.Idle.Seconds()/d.Seconds(), "runner-idle-share")
		// Collections during the run: the instances a suspending module makes as it ramps up
		// (their heap and their coroutines' stacks) drive most of them.
		b.ReportMetric(float64(gcs), "gc-cycles")
	}
}

// gcCycles is the number of completed GC cycles of the process.
func gcCycles() uint64 {
	s := []rtmetrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

func BenchmarkColdPath(b *testing.B) {
	// The AssemblyScript counter prefetches its count: a cold record waits for its value before
	// its call starts, holding no instance.
	b.Run("as", func(b *testing.B) { coldPath(b, loadModule(b, counterAS), 100_000, 400) })
	// The WAT counter reads with get_async inside its call: a cold read suspends the call (the
	// suspension path, in coroutine mode once misses are frequent).
	b.Run("wat-suspend", func(b *testing.B) { coldPath(b, loadModule(b, "../abi/testdata/counter.wasm"), 100_000, 400) })
	b.Run("go", func(b *testing.B) {
		m := loadModule(b, counterGo)
		coldPath(b, m, 100_000, 200)
		b.ReportMetric(float64(instanceFootprint(b, m, 32)), "bytes/instance")
	})
}

// instanceFootprint measures what one more instance costs: its linear memory and wazero's
// per-instance structures, as the growth of the Go heap and stacks in use per instance (linear
// memory is a Go allocation in wazero), plus the stack of a carrier goroutine that a call
// suspended on a carrier would hold.
func instanceFootprint(b *testing.B, m *abi.Module, n int) uint64 {
	inUse := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse + ms.StackInuse
	}
	before := inUse()
	insts := make([]*abi.Instance, n)
	for i := range insts {
		in, err := m.Instantiate(context.Background(), &plainHandler{backend: state.NewMemory(), out: newOutBuffer(&discardSink{})})
		if err != nil {
			b.Fatal(err)
		}
		insts[i] = in
	}
	after := inUse()
	for _, in := range insts {
		in.Close(context.Background())
	}
	const carrierStack = 8 << 10
	return (after-before)/uint64(n) + carrierStack
}

func BenchmarkInstanceFootprint(b *testing.B) {
	for _, p := range []struct{ name, path string }{{"as", counterAS}, {"go", counterGo}} {
		b.Run(p.name, func(b *testing.B) {
			m := loadModule(b, p.path)
			for b.Loop() {
				b.ReportMetric(float64(instanceFootprint(b, m, 64)), "bytes/instance")
			}
		})
	}
}

func readBatchEnv() int {
	n, _ := strconv.Atoi(os.Getenv("CLINK_BENCH_READ_BATCH"))
	return n
}
