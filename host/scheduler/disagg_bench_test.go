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
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// BenchmarkDisaggregated is issue 10's benchmark of the real path: the AssemblyScript counter
// over the tiered state on S3 (versitygw on loopback, started by make bench through
// scripts/with-s3.sh), behind a loopback proxy that delays every response's first byte by
// CLINK_BENCH_S3_LATENCY (default 20ms, typical of S3). Checkpoints run every second of the
// run's wall clock, persisted off the runner as the pipeline does. For each key distribution
// (Zipf with s = 1, uniform) and key count (100k; 1M with CLINK_BENCH_DISAGG_BIG=1) it runs the
// same events with the hot tier holding all the state, a third of it and a tenth of it, one
// after the other in the same process, and reports for the smaller tiers:
//
//   - x-all-hot: throughput ÷ the all-hot run's;
//   - littles-share: throughput ÷ min(all-hot throughput, the Little's-law bound
//     MaxInFlight ÷ (remote keys per record × mean GET latency)), from measured figures;
//   - gets/rec, keys/get (keys fetched per remote GET), hit-ratio, peak-instances;
//   - peak-rss-MiB: the process's peak so far (it only grows: read it in run order).
//
// CLINK_BENCH_DISAGG_EVENTS sets the events per run (default 300k).
func BenchmarkDisaggregated(b *testing.B) {
	ep := os.Getenv("CLINK_TEST_S3_ENDPOINT")
	if ep == "" {
		b.Skip("needs the loopback S3 server: scripts/with-s3.sh (make bench does it)")
	}
	lat := 20 * time.Millisecond
	if v := os.Getenv("CLINK_BENCH_S3_LATENCY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatal(err)
		}
		lat = d
	}
	events := 300_000
	if v, err := strconv.Atoi(os.Getenv("CLINK_BENCH_DISAGG_EVENTS")); err == nil && v > 0 {
		events = v
	}
	proxy := latencyProxy(b, ep, lat)
	bucket := os.Getenv("CLINK_TEST_S3_BUCKET")
	if bucket == "" {
		bucket = "clink-test"
	}
	m := loadModule(b, counterAS)
	keyCounts := []int{100_000}
	if os.Getenv("CLINK_BENCH_DISAGG_BIG") != "" {
		keyCounts = append(keyCounts, 1_000_000)
	}
	for _, keys := range keyCounts {
		for _, dist := range []string{"zipf", "uniform"} {
			b.Run(fmt.Sprintf("%s-%dk", dist, keys/1000), func(b *testing.B) {
				els := disaggEvents(events, keys, dist)
				for b.Loop() {
					newURL := func() string {
						return fmt.Sprintf("s3://%s/bench/%s?endpoint=%s&path_style=true", bucket, randomName(), url.QueryEscape(proxy))
					}
					hot := disaggRun(b, m, newURL(), 0, els)
					b.ReportMetric(hot.rate, "all-hot-rec/s")
					for _, frac := range []int{3, 10} {
						r := disaggRun(b, m, newURL(), max(hot.stateBytes/int64(frac), 64<<10), els)
						unit := fmt.Sprintf("1/%d-", frac)
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
						b.Logf("%s 1/%d hot (%d of %d bytes): %.0f rec/s = %.2f x all hot (%.0f); %.4f remote keys/rec, GET %v, bound %.0f (share %.2f); %.3f GETs/rec, %.1f keys/GET, hit %.3f, %d suspensions, %d instance waits, peak %d instances, %d spills, %d checkpoints (mean %v)",
							dist, frac, r.hotBytes, hot.stateBytes, r.rate, r.rate/hot.rate, hot.rate, r.keysPerRec, r.getLatency, bound, r.rate/bound,
							r.getsPerRec, r.keysPerGet, r.hitRatio, r.suspensions, r.instanceWaits, r.peakInstances, r.spills, r.checkpoints, r.ckptMean)
					}
				}
			})
		}
	}
}

type disaggResult struct {
	rate                           float64
	stateBytes, hotBytes           int64
	keysPerRec, getsPerRec         float64
	keysPerGet, hitRatio           float64
	getLatency, ckptMean           time.Duration
	inFlight                       int
	peakInstances, suspensions     int64
	instanceWaits, spills          int64
	checkpoints                    int64
	peakRSS                        int64
}

// disaggRun runs els through the counter over a fresh S3 prefix with the given hot budget
// (0: the default, which holds everything here), checkpointing every second.
func disaggRun(b *testing.B, m *abi.Module, pool string, hotBytes int64, els []Element) disaggResult {
	ctx := context.Background()
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
	c, err := New(Config{Module: m, Backend: be, Sink: &discardSink{}, OnBarrier: func(id uint64) error {
		s, err := be.Capture(id)
		if err != nil {
			return err
		}
		persist <- s
		return nil
	}})
	if err != nil {
		b.Fatal(err)
	}
	before := st.Metrics()
	in := make(chan []Element, 16)
	go func() {
		next, id := time.Now().Add(time.Second), uint64(1)
		for i := 0; i < len(els); i += 256 {
			in <- els[i:min(i+256, len(els))]
			if time.Now().After(next) {
				in <- []Element{{Kind: ElementBarrier, CheckID: id}}
				id++
				next = time.Now().Add(time.Second)
			}
		}
		in <- []Element{{Kind: ElementWatermark, TS: math.MaxInt64}}
		close(in)
	}()
	start := time.Now()
	if err := c.Run(ctx, in); err != nil {
		b.Fatal(err)
	}
	s, err := be.Capture(1 << 40)
	if err != nil {
		b.Fatal(err)
	}
	persist <- s
	close(persist)
	pw.Wait()
	d := time.Since(start)
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
	}
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

func randomName() string { return strconv.FormatUint(rand.Uint64(), 36) }
