package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	goruntime "runtime"
	rtmetrics "runtime/metrics"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/control"
)

// benchServer is a server with the runtime on a temporary directory, for benchmarks.
type benchServer struct {
	b   *testing.B
	srv *Server
	h   http.Handler
}

func newBenchServer(b *testing.B, opts ...func(*Config)) *benchServer {
	dir := b.TempDir()
	ctx := context.Background()
	st, err := control.OpenFileStore(dir)
	if err != nil {
		b.Fatal(err)
	}
	ctl, err := control.Open(ctx, st)
	if err != nil {
		b.Fatal(err)
	}
	cfg := Config{AdminToken: testAdmin, DataURL: dir, Logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&cfg)
	}
	srv, _, err := New(ctx, ctl, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Close(ctx) })
	return &benchServer{b: b, srv: srv, h: srv.Handler()}
}

func (s *benchServer) call(method, path, tok, ctype string, body []byte, want int) []byte {
	req := httptest.NewRequest(method, path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	w := httptest.NewRecorder()
	s.h.ServeHTTP(w, req)
	if w.Code != want {
		s.b.Fatalf("%s %s: %d %s", method, path, w.Code, w.Body.Bytes())
	}
	return w.Body.Bytes()
}

func (s *benchServer) callJSON(method, path, tok string, v any, want int) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		s.b.Fatal(err)
	}
	return s.call(method, path, tok, "application/json", b, want)
}

func (s *benchServer) tenant(name string, quotas map[string]any) string {
	var out struct{ Token string }
	json.Unmarshal(s.callJSON("POST", "/api/v1/tenants", testAdmin, map[string]any{"name": name, "quotas": quotas}, 201), &out)
	return out.Token
}

func (s *benchServer) pipeline(tok, module string, spec map[string]any) string {
	bin, err := os.ReadFile(filepath.Join("..", "abi", "testdata", module+".wasm"))
	if err != nil {
		s.b.Fatal(err)
	}
	s.call("POST", "/api/v1/modules?name="+module, tok, "application/wasm", bin, 201)
	var p PipelineView
	json.Unmarshal(s.callJSON("POST", "/api/v1/pipelines", tok, map[string]any{"name": module, "spec": spec}, 201), &p)
	return p.ID
}

// sinkWatch counts the records b's preview sink has written (Server.observeSink) and wakes a
// waiter on each write, so the closed loop waits for its batch without polling: a sleep of
// 200 µs between polls takes ~1 ms whenever the process is idle (Go's timers wait in epoll with
// millisecond resolution), which quantized b's batch time by about its own length.
type sinkWatch struct {
	n    atomic.Int64
	wake chan struct{}
}

func (s *benchServer) watchSinks() *sinkWatch {
	w := &sinkWatch{wake: make(chan struct{}, 1)}
	s.srv.observeSink = func(_ string, n int) {
		w.n.Add(int64(n))
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return w
}

// segment drives tenant b's pipeline closed-loop for d: post a batch, wait until its sink has
// all of it, again. It returns the records, the time taken and each batch's latency.
func (s *benchServer) segment(tok, id string, w *sinkWatch, batch []byte, perBatch int, d time.Duration) (int, time.Duration, []time.Duration) {
	base := "/api/v1/pipelines/" + id + "/records"
	want := w.n.Load()
	var lats []time.Duration
	stuck := time.NewTimer(time.Hour)
	defer stuck.Stop()
	start := time.Now()
	for time.Since(start) < d {
		t0 := time.Now()
		s.call("POST", base, tok, "application/x-ndjson", batch, 200)
		want += int64(perBatch)
		stuck.Reset(30 * time.Second)
		for w.n.Load() < want {
			select {
			case <-w.wake:
			case <-stuck.C:
				s.b.Fatalf("pipeline %s: its sink has %d of %d records after 30 s", id, w.n.Load(), want)
			}
		}
		lats = append(lats, time.Since(t0))
	}
	return len(lats) * perBatch, time.Since(start), lats
}

// usage is what the process and tenant a's guests used during a phase: process CPU (user +
// system, all goroutines, from getrusage), a's guest time (its CPU share's charge) and the
// number of GC cycles, to tell where b's time went.
type usage struct {
	cpu, guestA time.Duration
	gcs         uint32
	wall        time.Duration
	sched       []uint64 // the Go scheduler's latency histogram (runnable → running), cumulative
	stw         []uint64 // the GC's stop-the-world pauses, cumulative
	capacity    float64  // the host capacity the shares are scaled by (capacity.go), summed over samples
	samples     int
}

// The bounds of the /sched/latencies:seconds and /sched/pauses/total/gc:seconds histograms.
var schedBuckets, stwBuckets []float64

// schedLatencies reads the Go scheduler's latency histogram and the GC's stop-the-world pauses
// (from deciding to stop until the world runs again: a guest that computes without reaching a
// host call delays the stop until its next fuel check), cumulative counts.
func schedLatencies() (sched, stw []uint64) {
	m := []rtmetrics.Sample{{Name: "/sched/latencies:seconds"}, {Name: "/sched/pauses/total/gc:seconds"}}
	rtmetrics.Read(m)
	h, p := m[0].Value.Float64Histogram(), m[1].Value.Float64Histogram()
	schedBuckets, stwBuckets = h.Buckets, p.Buckets
	return slices.Clone(h.Counts), slices.Clone(p.Counts)
}

// histP99 is the 99th percentile of a histogram delta (counts over buckets).
func histP99(counts []uint64, buckets []float64) float64 {
	var total uint64
	for _, c := range counts {
		total += c
	}
	var run uint64
	for i, c := range counts {
		run += c
		if total > 0 && float64(run) >= 0.99*float64(total) {
			return buckets[i+1]
		}
	}
	return 0
}

// histSum is the summed value of a histogram delta, each sample at its bucket's lower bound.
func histSum(counts []uint64, buckets []float64) float64 {
	var sum float64
	for i, c := range counts {
		if lo := buckets[i]; c > 0 && lo > 0 {
			sum += float64(c) * lo
		}
	}
	return sum
}

func (s *benchServer) sample(tenant string) usage {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	u := usage{cpu: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), gcs: ms.NumGC, wall: time.Since(benchEpoch)}
	u.sched, u.stw = schedLatencies()
	s.srv.rt.mu.Lock()
	if sh := s.srv.rt.shares[tenant]; sh != nil {
		u.guestA = sh.Used()
	}
	u.capacity, u.samples = s.srv.rt.capacity, 1
	s.srv.rt.mu.Unlock()
	return u
}

var benchEpoch = time.Now()

// report adds a phase's usage (from u0 to u1) as metrics named after the phase.
func report(b *testing.B, phase string, u0, u1 usage) {
	wall := (u1.wall - u0.wall).Seconds()
	b.ReportMetric((u1.cpu-u0.cpu).Seconds()/wall, phase+"-proc-cores")
	b.ReportMetric((u1.guestA-u0.guestA).Seconds()/wall, phase+"-a-guest-cores")
	b.ReportMetric(float64(u1.gcs-u0.gcs)/wall, phase+"-gc/s")
	if u1.sched != nil {
		b.ReportMetric(histP99(u1.sched, schedBuckets)*1e6, phase+"-sched-p99-µs")
	}
	if u1.stw != nil {
		b.ReportMetric(histP99(u1.stw, stwBuckets)*1e6, phase+"-stw-p99-µs")
		b.ReportMetric(histSum(u1.stw, stwBuckets)*1e3/wall, phase+"-stw-ms/s")
	}
	if u1.samples > 0 {
		b.ReportMetric(u1.capacity/float64(u1.samples), phase+"-capacity")
	}
}

// segments accumulates the closed-loop segments of one state of tenant a.
type segments struct {
	recs int
	el   time.Duration
	lats []time.Duration
	u    [2]usage // summed: the usage over the segments (u[1]-u[0])
}

func (g *segments) add(recs int, el time.Duration, lats []time.Duration, u0, u1 usage) {
	g.recs += recs
	g.el += el
	g.lats = append(g.lats, lats...)
	g.u[1].cpu += u1.cpu - u0.cpu
	g.u[1].guestA += u1.guestA - u0.guestA
	g.u[1].gcs += u1.gcs - u0.gcs
	g.u[1].wall += u1.wall - u0.wall
	g.u[1].capacity += u1.capacity // at each segment's end
	g.u[1].samples++
	if g.u[1].sched == nil {
		g.u[1].sched = make([]uint64, len(u1.sched))
	}
	for i := range u1.sched {
		g.u[1].sched[i] += u1.sched[i] - u0.sched[i]
	}
	if g.u[1].stw == nil {
		g.u[1].stw = make([]uint64, len(u1.stw))
	}
	for i := range u1.stw {
		g.u[1].stw[i] += u1.stw[i] - u0.stw[i]
	}
}

func (g *segments) thr() float64 { return float64(g.recs) / g.el.Seconds() }

func (g *segments) p50() time.Duration {
	slices.Sort(g.lats)
	return g.lats[len(g.lats)/2]
}

// BenchmarkNoisyNeighbour: tenant b's throughput and latency (a closed-loop ingest → counter
// → preview pipeline) while tenant a runs a CPU-heavy pipeline (a generator at full speed into
// the burn operator at parallelism 2, within its max_subtasks), in one run:
//
//   - b alone (a stopped), before and after everything else;
//   - a with no CPU quota (guest_cpu_millicores 0): b-noisy-unbounded/alone;
//   - then interleaved rounds of short segments, a's share switched by live PATCHes between
//     idle (1 millicore: a's guests all but stopped), one core (the default quota) and a
//     quarter core, in a rotating order so that the machine's drift (other processes on a
//     shared VM) falls on every state alike. b-noisy/alone is b's throughput with a at one core
//     over b's throughput with a idle, over the same rounds; b-noisy-quarter/alone the same at
//     a quarter core; b-idle/alone checks the idle state against a stopped a.
//
// Each state also reports the process's CPU (cores, from getrusage), a's guest time (cores, its
// share's charge: wall time while a guest runs), GC cycles per second, the Go scheduler's p99
// latency and the host capacity the shares were scaled by. The whole sequence runs twice:
// capacity-scaled (the default) and fixed-shares (Config.FixedCPUShares).
func BenchmarkNoisyNeighbour(b *testing.B) {
	// Shares scaled to the host's capacity (the default) and at their quotas (--fixed-cpu-shares),
	// one after the other in each run.
	// The guest CPU budget is off (cpubudget.go): it would refuse tenant a's start with no CPU
	// quota beside b, and the unbounded state is what the shares are measured against.
	noBudget := func(c *Config) { c.GuestCPUBudget = -1 }
	b.Run("capacity-scaled", func(b *testing.B) { noisyNeighbour(b, noBudget) })
	b.Run("fixed-shares", func(b *testing.B) {
		noisyNeighbour(b, noBudget, func(c *Config) { c.FixedCPUShares = true })
	})
}

func noisyNeighbour(b *testing.B, opts ...func(*Config)) {
	const (
		phaseDur = 2 * time.Second
		segDur   = 400 * time.Millisecond
		rounds   = 5
	)
	for range b.N {
		s := newBenchServer(b, opts...)
		tokB := s.tenant("b", map[string]any{"api_requests_per_second": 1000000})
		tokA := s.tenant("a", map[string]any{"api_requests_per_second": 1000000, "max_subtasks": 4, "max_in_flight_records": 128, "guest_cpu_millicores": 0})
		idB := s.pipeline(tokB, "counter", map[string]any{
			"checkpoints": map[string]any{"interval": "1s"},
			"sources":     []any{map[string]any{"name": "in", "type": "http"}},
			"operators":   []any{map[string]any{"name": "count", "module": "counter", "inputs": []any{"in"}, "key": "user"}},
			"sinks":       []any{map[string]any{"name": "out", "type": "preview", "inputs": []any{"count"}}},
		})
		idA := s.pipeline(tokA, "burn", map[string]any{
			"checkpoints": map[string]any{"interval": "1s"},
			"sources":     []any{map[string]any{"name": "gen", "type": "generator", "kind": "counter", "keys": 1000}},
			"operators":   []any{map[string]any{"name": "burn", "module": "burn", "inputs": []any{"gen"}, "key": "key", "parallelism": 2}},
			"sinks":       []any{map[string]any{"name": "out", "type": "discard", "inputs": []any{"burn"}}},
		})
		watch := s.watchSinks() // before b starts: its preview sink is made at the start
		s.call("POST", "/api/v1/pipelines/"+idB+"/start", tokB, "", nil, 202)
		const keys, perKey = 50, 4
		batch := records(keys, perKey, 0)
		seg := func(g *segments, d time.Duration) {
			u0 := s.sample("a")
			n, el, lats := s.segment(tokB, idB, watch, batch, keys*perKey, d)
			g.add(n, el, lats, u0, s.sample("a"))
		}
		var alone, unbounded segments
		seg(&segments{}, phaseDur/4) // warm up
		seg(&alone, phaseDur)

		s.call("POST", "/api/v1/pipelines/"+idA+"/start", tokA, "", nil, 202)
		// A runs once its source has produced past what the channels buffer (the operators'
		// own counters are published only when their runners wait, which a busy one never does).
		aSource := func() int64 {
			r := s.srv.rt.active(idA)
			if r == nil {
				return 0
			}
			var n int64
			for _, src := range r.job.Metrics().Sources {
				n += src.RecordsIn
			}
			return n
		}
		for i := 0; aSource() < 20000; i++ {
			if i > 6000 {
				b.Fatal("tenant a's pipeline does not run")
			}
			time.Sleep(10 * time.Millisecond)
		}
		a0 := aSource()
		seg(&unbounded, phaseDur)
		aRecsU := aSource() - a0

		states := []struct {
			name       string
			millicores int
			g          segments
			aRecs      int64
		}{{name: "idle", millicores: 1}, {name: "noisy", millicores: 1000}, {name: "quarter", millicores: 250}}
		for r := range rounds {
			for i := range states {
				st := &states[(i+r)%len(states)]
				s.callJSON("PATCH", "/api/v1/tenants/a", testAdmin, map[string]any{"quotas": map[string]any{"guest_cpu_millicores": st.millicores}}, 200)
				a0 := aSource()
				seg(&st.g, segDur)
				st.aRecs += aSource() - a0
			}
		}
		s.callJSON("POST", "/api/v1/pipelines/"+idA+"/stop", tokA, map[string]any{"savepoint": false}, 200)
		seg(&alone, phaseDur)

		idle, noisy, quarter := &states[0].g, &states[1].g, &states[2].g
		aSec := func(g *segments) float64 { return g.el.Seconds() }
		b.ReportMetric(alone.thr(), "b-alone-rec/s")
		b.ReportMetric(noisy.thr(), "b-noisy-rec/s")
		b.ReportMetric(noisy.thr()/idle.thr(), "b-noisy/alone")
		b.ReportMetric(quarter.thr()/idle.thr(), "b-noisy-quarter/alone")
		b.ReportMetric(idle.thr()/alone.thr(), "b-idle/alone")
		b.ReportMetric(unbounded.thr()/alone.thr(), "b-noisy-unbounded/alone")
		b.ReportMetric(float64(alone.p50())/1e6, "b-alone-p50-ms")
		b.ReportMetric(float64(idle.p50())/1e6, "b-idle-p50-ms")
		b.ReportMetric(float64(noisy.p50())/1e6, "b-noisy-p50-ms")
		b.ReportMetric(float64(quarter.p50())/1e6, "b-noisy-quarter-p50-ms")
		b.ReportMetric(float64(unbounded.p50())/1e6, "b-noisy-unbounded-p50-ms")
		b.ReportMetric(float64(states[1].aRecs)/aSec(noisy), "a-rec/s")
		b.ReportMetric(float64(states[2].aRecs)/aSec(quarter), "a-quarter-rec/s")
		b.ReportMetric(float64(aRecsU)/aSec(&unbounded), "a-unbounded-rec/s")
		for _, g := range []struct {
			name string
			g    *segments
		}{{"alone", &alone}, {"idle", idle}, {"noisy", noisy}, {"quarter", quarter}, {"unbounded", &unbounded}} {
			report(b, g.name, g.g.u[0], g.g.u[1])
		}
	}
}

// BenchmarkIngestOneProcessor: tenant b's closed loop (as in BenchmarkNoisyNeighbour) alone,
// in alternating segments on one Go processor and on two (runtime.GOMAXPROCS), rotating the
// order each round. One processor is what b has while tenant a's guest holds the other at its
// one-core share, without a's other effects (its GC, the kernel's CPU shared with a's thread):
// b-1p/2p is the part of b's throughput that its hand-offs between goroutines cost when they
// cannot overlap, the part of the noisy neighbour's loss that b's own path decides.
func BenchmarkIngestOneProcessor(b *testing.B) {
	const (
		segDur = 300 * time.Millisecond
		rounds = 8
	)
	procs := goruntime.GOMAXPROCS(0)
	defer goruntime.GOMAXPROCS(procs)
	for range b.N {
		s := newBenchServer(b)
		tokB := s.tenant("b", map[string]any{"api_requests_per_second": 1000000})
		idB := s.pipeline(tokB, "counter", map[string]any{
			"checkpoints": map[string]any{"interval": "1s"},
			"sources":     []any{map[string]any{"name": "in", "type": "http"}},
			"operators":   []any{map[string]any{"name": "count", "module": "counter", "inputs": []any{"in"}, "key": "user"}},
			"sinks":       []any{map[string]any{"name": "out", "type": "preview", "inputs": []any{"count"}}},
		})
		watch := s.watchSinks()
		s.call("POST", "/api/v1/pipelines/"+idB+"/start", tokB, "", nil, 202)
		const keys, perKey = 50, 4
		batch := records(keys, perKey, 0)
		s.segment(tokB, idB, watch, batch, keys*perKey, segDur) // warm up
		var g [2]segments                                       // by processors - 1
		for r := range rounds {
			for i := range 2 {
				p := (i + r) % 2
				goruntime.GOMAXPROCS(p + 1)
				u0 := s.sample("a")
				n, el, lats := s.segment(tokB, idB, watch, batch, keys*perKey, segDur)
				g[p].add(n, el, lats, u0, s.sample("a"))
			}
		}
		goruntime.GOMAXPROCS(procs)
		b.ReportMetric(g[0].thr()/g[1].thr(), "b-1p/2p")
		b.ReportMetric(g[0].thr(), "b-1p-rec/s")
		b.ReportMetric(g[1].thr(), "b-2p-rec/s")
		b.ReportMetric(float64(g[0].p50())/1e3, "b-1p-p50-µs")
		b.ReportMetric(float64(g[1].p50())/1e3, "b-2p-p50-µs")
		report(b, "1p", g[0].u[0], g[0].u[1])
		report(b, "2p", g[1].u[0], g[1].u[1])
	}
}
