package scheduler

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// BenchmarkDisaggregated is issue 10's benchmark of the real path: the AssemblyScript counter
// over the tiered state on S3 (versitygw on loopback, started by make bench through
// scripts/with-s3.sh), behind a loopback proxy that delays every response's first byte by each
// of CLINK_BENCH_S3_LATENCY (a comma-separated list, default "0s,20ms"; 20 ms is typical of
// S3). Checkpoints run every second of the run's wall clock, persisted off the runner as the
// pipeline does. For each latency, key distribution (Zipf with s = 1, uniform) and key count
// (100k; 1M with CLINK_BENCH_DISAGG_BIG=1) it runs the same events with the hot tier holding
// all the state, a third of it and a tenth of it, one after the other in the same process, and
// reports for the smaller tiers:
//
//   - x-all-hot: throughput ÷ the all-hot run's;
//   - littles-share: throughput ÷ min(all-hot throughput, the Little's-law bound
//     MaxInFlight ÷ (remote keys per record × mean GET latency)), from measured figures;
//   - gets/rec, keys/get (keys fetched per remote GET), hit-ratio, peak-instances;
//   - cpu-us/rec: this process's CPU per record, and s3-cpu-us/get: the S3 server's CPU per
//     request (from /proc, when CLINK_TEST_S3_PID names it). Both share the machine's cores;
//   - peak-rss-MiB: the process's peak so far (it only grows: read it in run order).
//
// The ckpt-* case (at the first latency only) compares checkpoints every 100 ms with one final
// checkpoint, a tenth hot.
// CLINK_BENCH_DISAGG_EVENTS sets the events per run (default 100k). Such a short run is mostly
// fixed costs (the first checkpoint, the last fetches, the final checkpoint) and keys seen for
// the first time, which the filters answer without a read. The steady state is the *-1M-* case
// (at the last latency only): 1M records over the same 100k keys (CLINK_BENCH_DISAGG_LONG sets
// the count, 0 skips it), long enough to checkpoint every second several times a tenth hot and
// at least once all hot; only the two cases with a target (Zipf a tenth hot, uniform a third). CLINK_BENCH_DISAGG_SAMPLE=1
// samples the cold path every millisecond and logs what bounds each run by Little's law: keys
// asked of the backend and not answered, lookups running and their keys, admitted records, the
// share of the time at the in-flight cap, parked records, and the fetched keys by their use.
func BenchmarkDisaggregated(b *testing.B) {
	ep := os.Getenv("CLINK_TEST_S3_ENDPOINT")
	if ep == "" {
		b.Skip("needs the loopback S3 server: scripts/with-s3.sh (make bench does it)")
	}
	lats := []time.Duration{0, 20 * time.Millisecond}
	if v := os.Getenv("CLINK_BENCH_S3_LATENCY"); v != "" {
		lats = lats[:0]
		for _, f := range strings.Split(v, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(f))
			if err != nil {
				b.Fatal(err)
			}
			lats = append(lats, d)
		}
	}
	events := 100_000
	if v, err := strconv.Atoi(os.Getenv("CLINK_BENCH_DISAGG_EVENTS")); err == nil && v > 0 {
		events = v
	}
	long := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("CLINK_BENCH_DISAGG_LONG")); err == nil && v >= 0 {
		long = v
	}
	bucket := os.Getenv("CLINK_TEST_S3_BUCKET")
	if bucket == "" {
		bucket = "clink-test"
	}
	m := loadModule(b, counterAS)
	keyCounts := []int{100_000}
	if os.Getenv("CLINK_BENCH_DISAGG_BIG") != "" {
		keyCounts = append(keyCounts, 1_000_000)
	}
	for _, lat := range lats {
		proxy := latencyProxy(b, ep, lat)
		newURL := func() string {
			return fmt.Sprintf("s3://%s/bench/%s?endpoint=%s&path_style=true", bucket, randomName(), url.QueryEscape(proxy))
		}
		for _, keys := range keyCounts {
			for _, dist := range []string{"zipf", "uniform"} {
				b.Run(fmt.Sprintf("%s-%dk-lat%v", dist, keys/1000, lat), func(b *testing.B) {
					els := disaggEvents(events, keys, dist)
					for b.Loop() {
						hot := disaggRun(b, m, newURL(), 0, time.Second, els)
						b.ReportMetric(hot.rate, "all-hot-rec/s")
						b.ReportMetric(hot.cpuPerRec, "all-hot-cpu-us/rec")
						for _, frac := range []int{3, 10} {
							r := disaggRun(b, m, newURL(), max(hot.stateBytes/int64(frac), 64<<10), time.Second, els)
							reportDisagg(b, fmt.Sprintf("%s 1/%d hot", dist, frac), fmt.Sprintf("1/%d-", frac), r, hot)
						}
					}
				})
			}
		}
		if lat == lats[len(lats)-1] && long > 0 {
			// The steady state: long enough for several checkpoints at a tenth hot and at least
			// one all hot, over the 100k keys. Only the cases with a target.
			for _, lc := range []struct {
				dist string
				frac int
			}{{"zipf", 10}, {"uniform", 3}} {
				b.Run(fmt.Sprintf("%s-100k-%s-lat%v", lc.dist, eventsName(long), lat), func(b *testing.B) {
					els := disaggEvents(long, 100_000, lc.dist)
					for b.Loop() {
						hot := disaggRun(b, m, newURL(), 0, time.Second, els)
						b.ReportMetric(hot.rate, "all-hot-rec/s")
						b.ReportMetric(hot.cpuPerRec, "all-hot-cpu-us/rec")
						b.ReportMetric(float64(hot.checkpoints), "all-hot-checkpoints")
						r := disaggRun(b, m, newURL(), max(hot.stateBytes/int64(lc.frac), 64<<10), time.Second, els)
						b.ReportMetric(float64(r.checkpoints), fmt.Sprintf("1/%d-checkpoints", lc.frac))
						reportDisagg(b, fmt.Sprintf("%s 1/%d hot, %s records", lc.dist, lc.frac, eventsName(long)), fmt.Sprintf("1/%d-", lc.frac), r, hot)
					}
				})
			}
		}
		if lat != lats[0] {
			continue
		}
		b.Run(fmt.Sprintf("ckpt-zipf-100k-lat%v", lat), func(b *testing.B) {
			els := disaggEvents(events, 100_000, "zipf")
			for b.Loop() {
				hot := disaggRun(b, m, newURL(), 0, 0, els)
				final := disaggRun(b, m, newURL(), max(hot.stateBytes/10, 64<<10), 0, els)
				every := disaggRun(b, m, newURL(), max(hot.stateBytes/10, 64<<10), 100*time.Millisecond, els)
				b.ReportMetric(final.rate, "final-only-rec/s")
				b.ReportMetric(every.rate, "every-100ms-rec/s")
				b.ReportMetric(every.rate/final.rate, "x-final-only")
				b.ReportMetric(every.drainShare, "every-100ms-drain-share")
				b.ReportMetric(hot.rate, "all-hot-rec/s")
				b.Logf("checkpoints every 100 ms: %.0f rec/s = %.2f x final only (%.0f); %d checkpoints, mean %v", every.rate, every.rate/final.rate, final.rate, every.checkpoints, every.ckptMean)
			}
		})
	}
}

func reportDisagg(b *testing.B, name, unit string, r, hot disaggResult) {
	b.ReportMetric(r.rate, unit+"rec/s")
	b.ReportMetric(r.rate/hot.rate, unit+"x-all-hot")
	bound := hot.rate
	if r.keysPerRec > 0 && r.getLatency > 0 {
		bound = min(bound, float64(r.inFlight)/(r.keysPerRec*r.getLatency.Seconds()))
	}
	b.ReportMetric(r.rate/bound, unit+"littles-share")
	b.ReportMetric(r.getsPerRec, unit+"gets/rec")
	b.ReportMetric(r.keysPerGet, unit+"keys/get")
	b.ReportMetric(r.hitRatio, unit+"hit-ratio")
	b.ReportMetric(float64(r.peakInstances), unit+"peak-instances")
	b.ReportMetric(float64(r.peakRSS>>20), unit+"peak-rss-MiB")
	b.ReportMetric(r.cpuPerRec, unit+"cpu-us/rec")
	b.ReportMetric(r.drainShare, unit+"drain-share")
	if r.serverCPUPerGet > 0 {
		b.ReportMetric(r.serverCPUPerGet, unit+"s3-cpu-us/get")
	}
	b.Logf("%s: %s", name, r.detail)
	if r.cold.samples > 0 {
		b.Logf("%s: %v; in-flight cap %d; %s", name, r.cold, r.inFlight, r.hist)
	}
	b.Logf("%s (%d of %d bytes): %.0f rec/s = %.2f x all hot (%.0f); %.4f remote keys/rec, GET %v, bound %.0f (share %.2f); %.3f GETs/rec, %.1f keys/GET, hit %.3f; CPU %.1f µs/rec (all hot %.1f), S3 server %.0f µs/request; %d suspensions, %d instance waits, peak %d instances, %d spills, %d checkpoints (mean %v)",
		name, r.hotBytes, hot.stateBytes, r.rate, r.rate/hot.rate, hot.rate, r.keysPerRec, r.getLatency, bound, r.rate/bound,
		r.getsPerRec, r.keysPerGet, r.hitRatio, r.cpuPerRec, hot.cpuPerRec, r.serverCPUPerGet,
		r.suspensions, r.instanceWaits, r.peakInstances, r.spills, r.checkpoints, r.ckptMean)
}

type disaggResult struct {
	rate                       float64
	stateBytes, hotBytes       int64
	keysPerRec, getsPerRec     float64
	keysPerGet, hitRatio       float64
	getLatency, ckptMean       time.Duration
	inFlight                   int
	peakInstances, suspensions int64
	instanceWaits, spills      int64
	checkpoints                int64
	peakRSS                    int64
	cpuPerRec, serverCPUPerGet float64 // µs
	detail                     string  // where the remote requests went
	cold                       coldSample
	hist                       string
	drainShare                 float64 // barrier drains ÷ the wall time
	captured, maxCaptured      int64   // records barriers captured (capture.go), in all and at most
}

// fetchHist counts the fetched keys by how many of the run's events use them: a head key
// fetched costs a GET and parks its records behind the fetch.
type fetchHist struct {
	*state.Tiered
	freq map[string]int
	mu   sync.Mutex
	h    [5]int
	rec  [5]int
}

func (f *fetchHist) Fetch(keys []state.Key, done func([]state.Fetched, error)) {
	f.mu.Lock()
	for _, k := range keys {
		n := f.freq[string(k.Record)]
		i := 0
		for x := n; x >= 10 && i < 4; x /= 10 {
			i++
		}
		f.h[i]++
		f.rec[i] += n
	}
	f.mu.Unlock()
	f.Tiered.Fetch(keys, done)
}

func (f *fetchHist) String() string {
	return fmt.Sprintf("fetched keys by their records in the run: 1-9 %d, 10-99 %d, 100-999 %d, 1000-9999 %d, 10k+ %d", f.h[0], f.h[1], f.h[2], f.h[3], f.h[4])
}

// coldSample is what sampleColdPath saw of the cold path, time-averaged over the run.
type coldSample struct {
	samples                                     int
	keysOut, lookupsRunning, lookupKeys, parked float64 // means
	atMaxLookups                                float64 // share of samples with every lookup slot busy
	lookups, lookupKeysTotal                    int64
	maxKeysOut                                  int64
	admitted, atCap, capWaiting                 float64
	maxWaitingBytes                             int64
}

func (s coldSample) String() string {
	perLookup := 0.0
	if s.lookups > 0 {
		perLookup = float64(s.lookupKeysTotal) / float64(s.lookups)
	}
	return fmt.Sprintf("cold path (%d samples): keys out mean %.0f (max %d), lookups running mean %.2f (the lookup slot busy %.0f%% of the time), keys in running lookups mean %.0f, parked mean %.0f; %d lookups, %.1f keys/lookup",
		s.samples, s.keysOut, s.maxKeysOut, s.lookupsRunning, 100*s.atMaxLookups, s.lookupKeys, s.parked, s.lookups, perLookup) +
		fmt.Sprintf("; admitted mean %.0f, at the in-flight cap %.0f%% of the time, waiting for room under it mean %.0f, waiting records' bytes max %d", s.admitted, 100*s.atCap, s.capWaiting, s.maxWaitingBytes)
}

// sampleColdPath samples the backend's cold-path gauges every millisecond until the returned
// function is called, which returns the means.
func sampleColdPath(be *state.Tiered, c *Controller) func() coldSample {
	stop, done := make(chan struct{}), make(chan coldSample)
	m0 := be.Metrics()
	go func() {
		var s coldSample
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				m := be.Metrics()
				s.lookups, s.lookupKeysTotal = m.Lookups-m0.Lookups, m.LookupKeys-m0.LookupKeys
				if n := float64(s.samples); n > 0 {
					s.keysOut /= n
					s.lookupsRunning /= n
					s.lookupKeys /= n
					s.parked /= n
					s.atMaxLookups /= n
					s.admitted /= n
					s.atCap /= n
					s.capWaiting /= n
				}
				done <- s
				return
			case <-t.C:
			}
			m := be.Metrics()
			s.samples++
			s.keysOut += float64(m.FetchKeysOut)
			s.maxKeysOut = max(s.maxKeysOut, m.FetchKeysOut)
			s.lookupsRunning += float64(m.LookupsRunning)
			s.lookupKeys += float64(m.LookupKeysRunning)
			if m.LookupsRunning >= 1 { // state.maxLookups
				s.atMaxLookups++
			}
			sm := c.Metrics()
			s.parked += float64(sm.Parked)
			s.admitted += float64(sm.Admitted)
			if sm.Admitted-sm.Parked-sm.CapWaiting >= int64(c.MaxInFlight()) {
				s.atCap++
			}
			s.capWaiting += float64(sm.CapWaiting)
			s.maxWaitingBytes = max(s.maxWaitingBytes, sm.WaitingBytes)
		}
	}()
	return func() coldSample { close(stop); return <-done }
}

// disaggRun runs els through the counter over a fresh S3 prefix with the given hot budget
// (0: the default, which holds everything here), checkpointing every ckpt of wall-clock time
// (0: only at the end).
func disaggRun(b *testing.B, m *abi.Module, pool string, hotBytes int64, ckpt time.Duration, els []Element) disaggResult {
	// A profile (-cpuprofile) can take one case alone: -tagfocus hot=all, or hot=bN for a hot
	// tier of N bytes (goroutines started here carry the labels).
	tag := "all"
	if hotBytes > 0 {
		tag = "b" + strconv.FormatInt(hotBytes, 10)
	}
	prev := context.Background()
	ctx := pprof.WithLabels(prev, pprof.Labels("hot", tag, "ckpt", ckpt.String()))
	pprof.SetGoroutineLabels(ctx)
	defer pprof.SetGoroutineLabels(prev)
	opts := []state.Option{}
	if hotBytes > 0 {
		opts = append(opts, state.WithHotBytes(hotBytes))
	}
	st, err := state.Open(ctx, pool, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	be, err := st.Operator(ctx, state.OperatorOptions{Name: "counter"})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	if err := be.Open(m.Manifest.States); err != nil {
		b.Fatal(err)
	}
	// Checkpoints persist in order on one goroutine, off the runner, as the pipeline's do.
	persist := make(chan state.Snapshot, 64)
	var persistErr error
	var pw sync.WaitGroup
	pw.Add(1)
	go func() {
		defer pw.Done()
		for s := range persist {
			if err := s.Persist(ctx); err != nil && persistErr == nil {
				persistErr = err
			}
		}
	}()
	sample := os.Getenv("CLINK_BENCH_DISAGG_SAMPLE") != ""
	var backend state.Backend = be
	fb := &fetchHist{Tiered: be}
	if sample {
		fb.freq = map[string]int{}
		for _, e := range els {
			fb.freq[string(e.Key)]++
		}
		backend = fb
	}
	copts := []Option{WithOnBarrier(func(id uint64) error {
		s, err := be.Capture(id)
		if err != nil {
			return err
		}
		persist <- s
		return nil
	})}
	if os.Getenv("CLINK_BENCH_DISAGG_DRAIN") == "" {
		// Barriers capture the records not started, as the pipeline's do (capture.go);
		// CLINK_BENCH_DISAGG_DRAIN=1 drains them instead, for the comparison.
		copts = append(copts, WithBarrierCapture(CaptureAll))
	}
	if n, err := strconv.Atoi(os.Getenv("CLINK_BENCH_DISAGG_CAP")); err == nil && n > 0 {
		copts = append(copts, WithMaxInFlight(n))
	}
	c, err := New(m, backend, &discardSink{}, copts...)
	if err != nil {
		b.Fatal(err)
	}
	before := st.Metrics()
	cpu0, srv0 := processCPU(), serverCPU()
	start := time.Now()
	in := make(chan []Element, 16)
	var sent atomic.Int64 // when the last batch was sent, in ns after start
	go func() {
		defer func() { sent.Store(int64(time.Since(start))) }()
		next, id := time.Now().Add(ckpt), uint64(1)
		for i := 0; i < len(els); i += 256 {
			in <- els[i:min(i+256, len(els))]
			if ckpt > 0 && time.Now().After(next) {
				in <- []Element{{Kind: ElementBarrier, CheckID: id}}
				id++
				next = time.Now().Add(ckpt)
			}
		}
		in <- []Element{{Kind: ElementWatermark, TS: math.MaxInt64}}
		close(in)
	}()
	smp := func() coldSample { return coldSample{} }
	if sample {
		smp = sampleColdPath(be, c) // costs the runs ~0.1 µs of CPU per record
	}
	if err := c.Run(ctx, in); err != nil {
		b.Fatal(err)
	}
	cold := smp()
	ran := time.Since(start)
	s, err := be.Capture(1 << 40)
	if err != nil {
		b.Fatal(err)
	}
	persist <- s
	close(persist)
	pw.Wait()
	d := time.Since(start)
	cpu, srv := processCPU()-cpu0, serverCPU()-srv0
	if persistErr != nil {
		b.Fatal(persistErr)
	}
	sm, bm, after := c.Metrics(), be.Metrics(), st.Metrics()
	gets := after.RemoteGets - before.RemoteGets
	n := float64(len(els))
	r := disaggResult{
		rate: n / d.Seconds(), stateBytes: bm.HotBytes, hotBytes: hotBytes,
		keysPerRec: float64(bm.FetchKeys) / n, getsPerRec: float64(gets) / n, hitRatio: bm.HitRatio,
		getLatency: after.RemoteGetLatency, inFlight: c.MaxInFlight(),
		peakInstances: sm.PeakInstances, suspensions: sm.Suspensions, instanceWaits: sm.InstanceWaits,
		spills: bm.Spills, checkpoints: bm.Checkpoints,
		cpuPerRec: float64(cpu.Microseconds()) / n,
	}
	if reqs := after.RemoteGets + after.RemotePuts - before.RemoteGets - before.RemotePuts; srv > 0 && reqs > 0 {
		r.serverCPUPerGet = float64(srv.Microseconds()) / float64(reqs)
	}
	r.cold = cold
	r.hist = fb.String()
	r.detail = fmt.Sprintf("GETs %d (%d blocks; %d metas; %d retry rounds), PUTs %d (mean %v); fetched keys %d, found %d; %d segments, %d compactions, %d spill merges; runner backpressure %v, barrier drains %v, wall %v (input sent by %v, run done at %v, then the final checkpoint; runner idle %v, %v of it with input it could not admit); index %d B, in-memory segments %d B",
		gets, bm.FetchBlocks, bm.MetaLoads, bm.FetchRetryRounds, after.RemotePuts-before.RemotePuts, after.RemotePutLatency.Round(time.Millisecond),
		bm.FetchKeys, bm.FetchFound, bm.Segments, bm.Compactions, bm.SpillMerges, bm.Backpressure.Round(time.Millisecond), sm.BarrierDrain.Round(time.Millisecond), d.Round(time.Millisecond), time.Duration(sent.Load()).Round(time.Millisecond), ran.Round(time.Millisecond), sm.Idle.Round(time.Millisecond), sm.IdleFull.Round(time.Millisecond), bm.IndexBytes, bm.MemSegmentBytes)
	r.detail += fmt.Sprintf("; %d records on the all-hits loop, %d waited for prefetched values, %d for room under the cap", c.hotRuns, sm.PrefetchWaits, sm.CapWaits)
	r.drainShare = sm.BarrierDrain.Seconds() / d.Seconds()
	r.captured, r.maxCaptured = sm.CapturedRecords, sm.MaxCaptured
	r.detail += fmt.Sprintf("; barrier drains %.1f%% of the wall time, captures (the input captured, the timers, the state's Capture) %v (the input %v), %d records captured (at most %d at a barrier, %d bytes in all)",
		100*r.drainShare, sm.BarrierCapture.Round(time.Millisecond), sm.CaptureInput.Round(time.Millisecond), sm.CapturedRecords, sm.MaxCaptured, sm.CapturedBytes)
	if bm.FetchKeys > 0 && gets > 0 {
		r.keysPerGet = float64(bm.FetchKeys) / float64(gets)
	}
	if bm.Checkpoints > 0 {
		r.ckptMean = bm.CheckpointDuration / time.Duration(bm.Checkpoints)
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		r.peakRSS = ru.Maxrss << 10
	}
	return r
}

// disaggEvents returns n counter records over keys keys: Zipf with s = 1 (which math/rand's
// Zipf does not cover: it needs s > 1) or uniform.
func disaggEvents(n, keys int, dist string) []Element {
	rng := rand.New(rand.NewPCG(7, uint64(keys)))
	pick := func() int { return rng.IntN(keys) }
	if dist == "zipf" {
		cdf := make([]float64, keys)
		sum := 0.0
		for i := range cdf {
			sum += 1 / float64(i+1)
			cdf[i] = sum
		}
		// A random permutation, so that hot keys do not share a key-group or segment range.
		perm := rng.Perm(keys)
		pick = func() int { return perm[sort.SearchFloat64s(cdf, rng.Float64()*sum)] }
	}
	els := make([]Element, n)
	for i := range els {
		k := "user-" + strconv.Itoa(pick())
		els[i] = Element{Kind: ElementRecord, Key: []byte(k), Value: fmt.Appendf(nil, `{"user":%q,"seq":%d}`, k, i), TS: int64(i), Pos: int64(i + 1)}
	}
	return els
}

// latencyProxy forwards to the S3 endpoint, holding each response's first byte back by lat.
// The Host header is kept, so the requests' signatures still verify.
func latencyProxy(b *testing.B, endpoint string, lat time.Duration) string {
	target, err := url.Parse(endpoint)
	if err != nil {
		b.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 1024}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := time.NewTimer(lat)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
		rp.ServeHTTP(w, r)
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU is the S3 server's CPU time so far, from /proc/PID/stat (CLINK_TEST_S3_PID, set by
// scripts/s3-up.sh), or 0.
func serverCPU() time.Duration {
	pid := os.Getenv("CLINK_TEST_S3_PID")
	if pid == "" {
		return 0
	}
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the command (which may hold spaces) in parentheses; utime and stime are
	// the 14th and 15th, in clock ticks (100 per second on Linux).
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(u+s) * 10 * time.Millisecond
}

// eventsName is n as a sub-benchmark's name has it: 1M, 300k, 1234.
func eventsName(n int) string {
	switch {
	case n%1_000_000 == 0:
		return strconv.Itoa(n/1_000_000) + "M"
	case n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

func randomName() string { return strconv.FormatUint(rand.Uint64(), 36) }
