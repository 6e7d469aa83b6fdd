package lookup

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// fakeClockSched makes the limiter's scheduling-latency correction (schedlat.go) read no
// latency for the rest of t, which must not run in parallel: on synctest's fake clock the
// samples hold no real waits, while the runtime's histogram is of real time, so a loaded host
// would take real milliseconds out of fake-time latencies and move the limit.
func fakeClockSched(t *testing.T) {
	prev := readSchedMetrics
	readSchedMetrics = func(s []metrics.Sample) {
		for i := range s {
			s[i].Value = metrics.Value{} // KindBad: since reports 0
		}
	}
	t.Cleanup(func() { readSchedMetrics = prev })
}

// workerPool is an upstream with a fixed number of workers and a FIFO queue in front of them,
// like a service with a thread pool: latency is the service time until the workers are busy,
// then grows with the queue we put in it.
type workerPool struct {
	slots   chan struct{}
	service atomic.Int64 // ns
	workers atomic.Int32
}

func newWorkerPool(workers int, service time.Duration) *workerPool {
	p := &workerPool{slots: make(chan struct{}, workers)}
	p.service.Store(int64(service))
	p.workers.Store(int32(workers))
	return p
}

// retire takes n workers away for good (their slots stay occupied).
func (p *workerPool) retire(n int) {
	for i := 0; i < n; i++ {
		p.slots <- struct{}{}
	}
	p.workers.Add(int32(-n))
}

func (p *workerPool) handle(w http.ResponseWriter, r *http.Request) {
	p.slots <- struct{}{}
	time.Sleep(time.Duration(p.service.Load()))
	<-p.slots
}

type adaptPoint struct {
	at         time.Duration
	limit      int
	throughput float64       // per second over the last interval
	capacity   float64       // the upstream's capacity over the interval (workers / service), if known
	upstream   time.Duration // p50 attempt latency: the queue we put in the upstream shows here
	e2e        time.Duration // p50 Do to done, including the wait in our own queue
}

// diffHist returns the samples of cur not in prev.
func diffHist(cur, prev Histogram) Histogram {
	for i := range cur.Counts {
		cur.Counts[i] -= prev.Counts[i]
	}
	cur.Count -= prev.Count
	cur.Sum -= prev.Sum
	return cur
}

// runAdaptive drives an endpoint with `users` closed-loop clients against a worker pool whose
// service time doubles at half time, and samples the limit every `every`.
func runAdaptive(t *testing.T, e *Endpoint, pool *workerPool, users int, total, every time.Duration, step func()) []adaptPoint {
	req, _ := ParseRequest([]byte("GET /x"))
	var completed atomic.Int64
	stop := make(chan struct{})
	var running atomic.Int32
	for i := 0; i < users; i++ {
		running.Add(1)
		var loop func(Response)
		loop = func(r Response) {
			if r.Err != nil && Kind(r.Err) != KindNone {
				t.Errorf("request failed: %v", r.Err)
			}
			completed.Add(1)
			select {
			case <-stop:
				running.Add(-1)
				return
			default:
			}
			e.Do(context.Background(), req, loop)
		}
		e.Do(context.Background(), req, loop)
	}
	var pts []adaptPoint
	start := time.Now()
	last := int64(0)
	prev := e.Metrics()
	stepped := false
	for time.Since(start) < total {
		time.Sleep(every)
		svc := time.Duration(pool.service.Load())
		if time.Since(start) >= total/2 && !stepped {
			step()
			stepped = true
		}
		m := e.Metrics()
		c := completed.Load()
		pts = append(pts, adaptPoint{at: time.Since(start), limit: m.Limit, throughput: float64(c-last) / every.Seconds(),
			capacity: float64(pool.workers.Load()) / svc.Seconds(),
			upstream: diffHist(m.Upstream, prev.Upstream).Quantile(0.5), e2e: diffHist(m.Latency, prev.Latency).Quantile(0.5)})
		last, prev = c, m
	}
	close(stop)
	for running.Load() > 0 {
		time.Sleep(10 * time.Millisecond)
	}
	return pts
}

func formatSeries(pts []adaptPoint) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%8s %6s %8s %9s %13s %9s\n", "t", "limit", "req/s", "capacity", "upstream p50", "e2e p50")
	for _, p := range pts {
		fmt.Fprintf(&b, "%8v %6d %8.0f %9.0f %13v %9v\n", p.at.Round(time.Millisecond), p.limit, p.throughput, p.capacity, p.upstream, p.e2e)
	}
	return b.String()
}

// TestAdaptiveConcurrency runs each controller against a worker pool (8 workers, 20 ms) with
// 64 clients; at half time the service time doubles. A controller should keep the limit
// near the pool's knee (8..16), so that latency stays near the setpoint instead of the 8×
// queueing that 64 in flight would cause, and after the step it should re-learn the baseline
// and return there within a few seconds, with throughput at the pool's new capacity.
func TestAdaptiveConcurrency(t *testing.T) {
	fakeClockSched(t)
	for _, alg := range []string{"gradient", "pid", "aimd"} {
		t.Run(alg, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const workers, service = 8, 20 * time.Millisecond
				pool := newWorkerPool(workers, service)
				mn := newMemNet(t, pool.handle)
				cfg := memConfig()
				cfg.MaxInFlight = 64
				cfg.SingleFlight = "off"
				cfg.Concurrency.Algorithm = alg
				e := open(t, NewRegistry(WithDialer(mn.dial)), "t1", cfg)
				pts := runAdaptive(t, e, pool, 64, 30*time.Second, 500*time.Millisecond,
					func() { pool.service.Store(int64(2 * service)) })
				t.Logf("%s: 8 workers, service 20ms → 40ms at 15s, 64 clients\n%s", alg, formatSeries(pts))

				check := func(from, to time.Duration, capacity float64) {
					for _, p := range pts {
						if p.at <= from || p.at > to {
							continue
						}
						if p.limit < workers || p.limit > 2*workers {
							t.Errorf("t=%v: limit %d outside [%d, %d]", p.at, p.limit, workers, 2*workers)
						}
						if p.throughput < 0.85*capacity {
							t.Errorf("t=%v: throughput %.0f/s < 85%% of capacity %.0f/s", p.at, p.throughput, capacity)
						}
					}
				}
				check(5*time.Second, 15*time.Second, workers/service.Seconds())
				check(20*time.Second, 30*time.Second, workers/(2*service).Seconds()) // within 5 s of the step
				m := e.Metrics()
				if alg == "gradient" {
					return // it steers by throughput: its baseline is measured once, at the start
				}
				if math.Abs(float64(m.BaselineRTT-2*service)) > float64(service/10) {
					t.Errorf("baseline %v after the step, want ~%v", m.BaselineRTT, 2*service)
				}
			})
		})
	}
}

// TestAdaptiveOverload: the upstream loses half its workers (8 → 4) at 15 s, so the same
// latency now means twice the queue. The controller must back off to about half the limit,
// bringing the upstream's latency back to the setpoint, with throughput at the new capacity.
func TestAdaptiveOverload(t *testing.T) {
	fakeClockSched(t)
	for _, alg := range []string{"gradient", "pid", "aimd"} {
		t.Run(alg, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const workers, service = 8, 20 * time.Millisecond
				pool := newWorkerPool(workers, service)
				mn := newMemNet(t, pool.handle)
				cfg := memConfig()
				cfg.MaxInFlight = 64
				cfg.SingleFlight = "off"
				cfg.Concurrency.Algorithm = alg
				e := open(t, NewRegistry(WithDialer(mn.dial)), "t1", cfg)
				var retire sync.WaitGroup
				retire.Add(1)
				pts := runAdaptive(t, e, pool, 64, 30*time.Second, 500*time.Millisecond,
					func() { go func() { defer retire.Done(); pool.retire(workers / 2) }() })
				t.Logf("%s: service 20ms, 8 workers → 4 at 15s, 64 clients\n%s", alg, formatSeries(pts))
				for _, p := range pts {
					if p.at > 20*time.Second {
						if p.limit < workers/2 || p.limit > workers {
							t.Errorf("t=%v: limit %d outside [%d, %d]", p.at, p.limit, workers/2, workers)
						}
						if p.throughput < 0.85*p.capacity {
							t.Errorf("t=%v: throughput %.0f/s < 85%% of capacity %.0f/s", p.at, p.throughput, p.capacity)
						}
						// Unlimited, 64 in flight on 4 workers would queue for 16 × 20 ms.
						if p.upstream > 3*service {
							t.Errorf("t=%v: upstream p50 %v: the limiter did not back off", p.at, p.upstream)
						}
					}
				}
				retire.Wait()
			})
		})
	}
}

func TestPIDAntiWindup(t *testing.T) {
	p := pid{kp: 0.3, ki: 5, outMin: 0, outMax: 1}
	var out float64
	for i := 0; i < 100; i++ {
		out = p.update(1, 0.1)
	}
	if out != 1 || p.integral > 1 {
		t.Fatalf("output %v integral %v: not clamped", out, p.integral)
	}
	// After a long saturation, a reversed error acts at once instead of unwinding first.
	if out := p.update(-0.5, 0.1); out >= 1 {
		t.Fatalf("wound up: output %v after the error reversed", out)
	}
}

// sharedCPU is an upstream without a worker pool, whose requests share a CPU: each one's
// latency grows with the requests in flight when it arrives, by base × (1 + n/per), so its
// throughput keeps growing with the concurrency, ever more slowly (d ln rate / d ln n =
// 1 / (1 + n/per)).
type sharedCPU struct {
	base   time.Duration
	per    float64
	active atomic.Int64
}

func (u *sharedCPU) handle(w http.ResponseWriter, r *http.Request) {
	n := u.active.Add(1)
	time.Sleep(time.Duration(float64(u.base) * (1 + float64(n)/u.per)))
	u.active.Add(-1)
}

// rate is the upstream's throughput at n in flight.
func (u *sharedCPU) rate(n float64) float64 {
	return n / (u.base.Seconds() * (1 + n/u.per))
}

// TestAdaptiveSharedCPU is issue 11's h2c case in fake time: an upstream whose latency at 64
// in flight is 5 × its unloaded latency but still gives 1.7 × the throughput of 16 in flight
// (its gradient at 64 is 0.2). The latency controllers stop where latency crosses 1.5 × the
// baseline (about 8 in flight, half the throughput of 64); the gradient controller goes on to
// MaxInFlight, within 5% of the fixed limit's throughput. With MaxInFlight 512 it must still
// stop where more concurrency buys too little (its gradient floor, 0.1: at about 144 in
// flight), not queue 512 requests in the upstream.
func TestAdaptiveSharedCPU(t *testing.T) {
	fakeClockSched(t)
	for _, tc := range []struct {
		maxInFlight    int
		lo, hi         int     // the limit's range over the second half
		minShareOfBest float64 // throughput over the second half ÷ the upstream's rate at lo..hi's best
	}{
		{maxInFlight: 64, lo: 48, hi: 64, minShareOfBest: 0.95},
		{maxInFlight: 512, lo: 96, hi: 288, minShareOfBest: 0.85},
	} {
		t.Run(fmt.Sprint(tc.maxInFlight), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				u := &sharedCPU{base: 20 * time.Millisecond, per: 16}
				e := openSharedCPU(t, u, tc.maxInFlight, 4*tc.maxInFlight, "")
				pool := newWorkerPool(1, 0) // runAdaptive's capacity column only
				pts := runAdaptive(t, e, pool, tc.maxInFlight, 60*time.Second, 500*time.Millisecond, func() {})
				t.Logf("gradient, shared CPU 20ms × (1 + n/16), max_in_flight %d\n%s", tc.maxInFlight, formatSeries(pts))
				var sum float64
				var n int
				for _, p := range pts {
					if p.at <= 30*time.Second {
						continue
					}
					if p.limit < tc.lo || p.limit > tc.hi {
						t.Errorf("t=%v: limit %d outside [%d, %d]", p.at, p.limit, tc.lo, tc.hi)
					}
					sum += p.throughput
					n++
				}
				best := u.rate(float64(tc.hi))
				if got := sum / float64(n); got < tc.minShareOfBest*best {
					t.Errorf("throughput %.0f/s over the second half < %.2f × %.0f/s (the rate at %d in flight)", got, tc.minShareOfBest, best, tc.hi)
				}
			})
		})
	}
}

// TestGradientHoldsAtCeiling: at max_in_flight the gradient controller probes below the
// limit rarely (holdCeiling), because there each down phase costs the rate that its
// gradient gives up, for nothing when the ceiling is right; and it still comes down from
// the ceiling when the upstream is a worker pool past its knee.
func TestGradientHoldsAtCeiling(t *testing.T) {
	fakeClockSched(t)
	// capacities samples the limiter's capacity at the ceiling (−1 below it) every 5 ms while
	// runAdaptive drives it.
	capacities := func(e *Endpoint, users int, total time.Duration) (caps []int, limits []adaptPoint) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			start := time.Now()
			for time.Since(start) < total {
				l := e.limiter
				l.mu.Lock()
				c := l.capacity()
				if l.limit < l.maxLimit {
					c = -1
				}
				caps = append(caps, c)
				l.mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
		limits = runAdaptive(t, e, newWorkerPool(1, 0), users, total, 500*time.Millisecond, func() {})
		<-done
		return caps, limits
	}
	t.Run("stay", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// TestAdaptiveSharedCPU's upstream: its gradient at 64 is 0.2, so 64 is right.
			e := openSharedCPU(t, &sharedCPU{base: 20 * time.Millisecond, per: 16}, 64, 256, "")
			caps, pts := capacities(e, 64, 30*time.Second)
			t.Logf("shared CPU 20ms × (1 + n/16), max_in_flight 64\n%s", formatSeries(pts))
			first := -1
			below, at, early := 0, 0, false
			for i, c := range caps {
				if first < 0 {
					if c == 64 {
						first = i
					}
					continue
				}
				if c >= 0 {
					at++
				}
				if c >= 0 && c < 64 {
					below++
					if at := time.Duration(i-first) * 5 * time.Millisecond; at < ceilingHold && !early {
						t.Errorf("capacity %d %v after the ramp reached the ceiling: a down phase within the hold", c, at)
						early = true
					}
				}
			}
			if first < 0 {
				t.Fatal("the ramp never reached max_in_flight")
			}
			// A cycle without holds spends one phase in four below the limit (0.27 of the
			// samples here); with them 0.15: this upstream's phases last 0.56 s.
			if share := float64(below) / float64(at); at == 0 || share > 0.2 {
				t.Errorf("with the limit at the ceiling, %d samples of %d below it, want ≤ 0.2 of them", below, at)
			}
		})
	})
	t.Run("leave", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// 8 workers under a ceiling of 16: latency at 16 is twice the unloaded one, under
			// the ramp's 4 ×, so the ramp ends at the ceiling, and the limit must come down.
			const workers = 8
			pool := newWorkerPool(workers, 20*time.Millisecond)
			mn := newMemNet(t, pool.handle)
			cfg := memConfig()
			cfg.MaxInFlight = 2 * workers
			cfg.SingleFlight = "off"
			e := open(t, NewRegistry(WithDialer(mn.dial)), "t1", cfg)
			pts := runAdaptive(t, e, pool, 2*workers, 20*time.Second, 500*time.Millisecond, func() {})
			t.Logf("8 workers, max_in_flight 16\n%s", formatSeries(pts))
			for _, p := range pts {
				if p.at > 10*time.Second && (p.limit < workers || p.limit > workers*5/4) {
					t.Errorf("t=%v: limit %d outside [%d, %d]", p.at, p.limit, workers, workers*5/4)
				}
			}
		})
	})
}

// TestGradientShortJob is issue 11's enrichment job in fake time: 20k requests from 512
// closed-loop callers against an upstream that shares a CPU, sized like the job's h1 figures
// on this machine (about 31k requests/s at 256 in flight, and a fixed 128 delivering 0.69 of
// that). The default limiter must finish within 5% of a fixed 256's time.
func TestGradientShortJob(t *testing.T) {
	fakeClockSched(t)
	job := func(algorithm string) time.Duration {
		var took time.Duration
		synctest.Test(t, func(t *testing.T) {
			e := openSharedCPU(t, &sharedCPU{base: 3700 * time.Microsecond, per: 209}, 256, 512, algorithm)
			req, _ := ParseRequest([]byte("GET /x"))
			const total, callers = 20_000, 512
			var issued, completed atomic.Int64
			done := make(chan struct{})
			var loop func(Response)
			loop = func(r Response) {
				if r.Err != nil {
					t.Errorf("request failed: %v", r.Err)
				}
				if completed.Add(1) == total {
					close(done)
				}
				if issued.Add(1) <= total {
					e.Do(context.Background(), req, loop)
				}
			}
			start := time.Now()
			for range callers {
				issued.Add(1)
				e.Do(context.Background(), req, loop)
			}
			<-done
			took = time.Since(start)
		})
		return took
	}
	fixed, def := job("fixed"), job("")
	t.Logf("20k requests: fixed 256 %v, default %v (%.3f of fixed's rate)", fixed, def, fixed.Seconds()/def.Seconds())
	if def.Seconds() > fixed.Seconds()/0.95 {
		t.Errorf("the default took %v, fixed 256 %v: under 0.95 of its rate", def, fixed)
	}
}

// openSharedCPU opens an endpoint on an in-memory upstream u, with single-flight off, the
// given in-flight and queue limits and concurrency algorithm ("" keeps memConfig's).
func openSharedCPU(t *testing.T, u *sharedCPU, maxInFlight, maxQueued int, algorithm string) *Endpoint {
	t.Helper()
	mn := newMemNet(t, u.handle)
	cfg := memConfig()
	cfg.MaxInFlight = maxInFlight
	cfg.MaxQueued = maxQueued
	cfg.SingleFlight = "off"
	if algorithm != "" {
		cfg.Concurrency.Algorithm = algorithm
	}
	return open(t, NewRegistry(WithDialer(mn.dial)), "t1", cfg)
}
