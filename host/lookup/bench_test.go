package lookup

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// rawServer is a minimal HTTP/1.1 keep-alive server on 127.0.0.1 for benchmarks: one
// goroutine per connection reads a request head (and discards a Content-Length body), waits
// the service time on a timer, and writes a fixed response; it closes after a request that
// asks for it, and on anything it cannot frame (a chunked request body). That is all the
// HTTP/1.1 a client of this benchmark needs, at a fraction of net/http's server cost (see
// httpServer), so on a small machine more of the CPU is left to the client under test. It
// measures the service time it actually delivered (time.Sleep(2ms) overshoots, more so under
// load), which is what the Little's-law bound is computed from.
type rawServer struct {
	ln       net.Listener
	service  atomic.Int64  // ns
	workers  chan struct{} // nil: unlimited concurrency
	served   atomic.Int64
	svcNanos atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]bool
	hops     *sync.Map // client local address → *hopStamp, for BenchmarkHops; nil otherwise
}

// hopStamp times one request on one connection of BenchmarkHops.
type hopStamp struct {
	read, wrote atomic.Int64 // server: head read, response about to be written (ns since hopEpoch)
}

var hopEpoch = time.Now()

func newRawServer(tb testing.TB, service time.Duration, workers int) *rawServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &rawServer{ln: ln, conns: map[net.Conn]bool{}}
	s.service.Store(int64(service))
	if workers > 0 {
		s.workers = make(chan struct{}, workers)
	}
	s.wg.Add(1)
	go s.accept()
	tb.Cleanup(s.close)
	return s
}

func (s *rawServer) url() string { return "http://" + s.ln.Addr().String() }

func (s *rawServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

var rawResponse = []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok")

func (s *rawServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer c.Close()
	r := bufio.NewReaderSize(c, 4096)
	var hop *hopStamp
	for {
		// Read the head: lines until an empty one.
		var length int64
		closeAfter := false
		for {
			line, err := r.ReadSlice('\n')
			if err != nil {
				return
			}
			line = bytes.TrimRight(line, "\r\n")
			if len(line) == 0 {
				break
			}
			name, value, _ := bytes.Cut(line, []byte(":"))
			value = bytes.TrimSpace(value)
			switch {
			case bytes.EqualFold(name, []byte("Content-Length")):
				n, err := strconv.ParseInt(string(value), 10, 64)
				if err != nil || n < 0 {
					return
				}
				length = n
			case bytes.EqualFold(name, []byte("Transfer-Encoding")):
				return // chunked request bodies are not needed here
			case bytes.EqualFold(name, []byte("Connection")) && bytes.EqualFold(value, []byte("close")):
				closeAfter = true
			}
		}
		if length > 0 {
			if _, err := r.Discard(int(length)); err != nil {
				return
			}
		}
		if s.hops != nil {
			if hop == nil {
				v, _ := s.hops.Load(c.RemoteAddr().String())
				hop, _ = v.(*hopStamp)
			}
			if hop != nil {
				hop.read.Store(int64(time.Since(hopEpoch)))
			}
		}
		if s.workers != nil {
			s.workers <- struct{}{}
		}
		t0 := time.Now()
		time.Sleep(time.Duration(s.service.Load()))
		s.svcNanos.Add(int64(time.Since(t0)))
		if s.workers != nil {
			<-s.workers
		}
		s.served.Add(1)
		if hop != nil {
			hop.wrote.Store(int64(time.Since(hopEpoch)))
		}
		if _, err := c.Write(rawResponse); err != nil || closeAfter {
			return
		}
	}
}

// meanService returns the mean service time delivered since the last call.
func (s *rawServer) meanService() time.Duration {
	n := s.served.Swap(0)
	ns := s.svcNanos.Swap(0)
	if n == 0 {
		return 0
	}
	return time.Duration(ns / n)
}

func (s *rawServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// cpuTime returns the CPU time (user + system) this process has used: client, server and
// the kernel's work on their behalf. Per request it is a steadier figure than the rate on a
// machine shared with other builds.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineBusy returns the CPU time all processes on the machine have used (from /proc/stat,
// Linux only; 0 elsewhere). Minus cpuTime it is what other work took from the benchmark.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 && i < 8 { // not idle, not iowait; no guest columns (counted in user)
			busy += n
		}
	}
	return time.Duration(busy) * (time.Second / 100) // USER_HZ
}

// cpuMeter measures a run's CPU: this process's (client, server and the kernel's work for
// both) per request, and the cores other processes used meanwhile (a disturbed run shows
// up there).
type cpuMeter struct {
	self, all time.Duration
	start     time.Time
}

func startCPU() cpuMeter { return cpuMeter{self: cpuTime(), all: machineBusy(), start: time.Now()} }

func (m cpuMeter) report(b *testing.B, requests int) {
	self := cpuTime() - m.self
	b.ReportMetric(float64(self.Microseconds())/float64(requests), "cpu_µs/req")
	b.ReportMetric(self.Seconds()/time.Since(m.start).Seconds(), "busy_cores")
	if all := machineBusy() - m.all; all > 0 {
		b.ReportMetric(max(0, (all-self).Seconds()/time.Since(m.start).Seconds()), "other_cores")
	}
}

// benchRegistry dials with a plain net.Dialer that still refuses anything but 127.0.0.1.
func benchRegistry(tb testing.TB) *Registry {
	dial, _ := loopbackOnly(tb)
	return NewRegistry(WithDialer(dial))
}

func benchConfig(url string, inflight int, alg string) EndpointConfig {
	return benchConfigT(url, inflight, alg, "")
}

// benchConfigT is benchConfig with a transport ("" for the default).
func benchConfigT(url string, inflight int, alg, transport string) EndpointConfig {
	cfg := testConfig(url)
	if transport != "" {
		cfg.Transport = transport
	}
	cfg.MaxInFlight = inflight
	cfg.SingleFlight = "off" // every request must reach the upstream
	cfg.Concurrency.Algorithm = alg
	cfg.Retry.MaxAttempts = 1
	return cfg
}

// closedLoop keeps n requests in flight until total have completed, and returns the elapsed
// time and the per-request latency histogram (Do to done).
func closedLoop(tb testing.TB, e *Endpoint, n, total int) (time.Duration, Histogram) {
	el, h, _ := closedLoopErrs(tb, e, n, total, true)
	return el, h
}

// closedLoopErrs is closedLoop that also counts failed requests; strict fails the benchmark
// on the first.
func closedLoopErrs(tb testing.TB, e *Endpoint, n, total int, strict bool) (time.Duration, Histogram, int64) {
	req, _ := ParseRequest([]byte("GET /x"))
	var started, completed atomic.Int64
	var errs atomic.Int64
	var h histogram
	done := make(chan struct{})
	var issue func()
	issue = func() {
		t0 := time.Now()
		e.Do(context.Background(), req, func(r Response) {
			h.record(time.Since(t0))
			if r.Err != nil || r.Status != 200 {
				if errs.Add(1) == 1 && strict {
					tb.Errorf("request failed: %d %v", r.Status, r.Err)
				}
			}
			if int(completed.Add(1)) == total {
				close(done)
				return
			}
			if int(started.Add(1)) <= total {
				issue()
			}
		})
	}
	start := time.Now()
	for i := 0; i < n && int(started.Add(1)) <= total; i++ {
		issue()
	}
	<-done
	return time.Since(start), h.snapshot(), errs.Load()
}

// BenchmarkThroughput: 256 in flight against a 2 ms loopback service. The bound is Little's
// law with the service time the server actually delivered: 256 / service. Reported:
// achieved/bound (target ≥ 0.8) and p99/service (target ≤ 3), CPU per request (client,
// server and kernel together) and the cores other processes took during the run.
//
// Sub-benchmarks: "raw" is the HTTP/1.1 ceiling, a minimal client (one goroutine and
// connection per in-flight request, no HTTP library) on the same server; "std", "h1" and
// "h2c" are the endpoint with net/http's Transport, the lean HTTP/1.1 transport
// (internal/h1) and the HTTP/2 cleartext transport (internal/h2, against h2Server);
// "nethttp-h2c" is net/http's own h2c client (http.Protocols with unencrypted HTTP/2, prior
// knowledge) against the same h2Server, the figure that justifies internal/h2; "pid" and
// "gradient" run the adaptive limiters. The "upstream-process" variants run the upstream in a child
// process (procServer), with its own scheduler; their cpu_µs/req is the client's alone and
// the upstream's CPU shows in other_cores. The "nethttp-server" variants use net/http's
// server (HTTP/1.1, or h2c), whose own CPU (about twice rawServer's) the ratio then carries.
func BenchmarkThroughput(b *testing.B) {
	const inflight, service = 256, 2 * time.Millisecond
	b.Run("raw", func(b *testing.B) {
		s := newRawServer(b, service, 0)
		total := max(b.N, 4*inflight)
		rawLoop(b, s.ln.Addr().String(), inflight, 20*inflight)
		s.meanService()
		cpu := startCPU()
		b.ResetTimer()
		el, h := rawLoop(b, s.ln.Addr().String(), inflight, total)
		b.StopTimer()
		reportThroughput(b, float64(total)/el.Seconds(), inflight, s.meanService(), h)
		cpu.report(b, total)
	})
	for _, v := range []struct{ name, transport, alg, server string }{
		{"std/fixed", "std", "fixed", "raw"},
		{"h1/fixed", "h1", "fixed", "raw"},
		{"h1/pid", "h1", "pid", "raw"},
		{"h1/gradient", "h1", "gradient", "raw"},
		{"h2c/fixed", "h2c", "fixed", "h2"},
		{"h2c/pid", "h2c", "pid", "h2"},
		{"h2c/gradient", "h2c", "gradient", "h2"},
		{"nethttp-h2c/fixed", "std-h2c", "fixed", "h2"},
		{"upstream-process/h1/fixed", "h1", "fixed", "proc-raw"},
		{"upstream-process/h1/fixed-loopserver", "h1", "fixed", "proc-loop"},
		{"upstream-process/h2c/fixed", "h2c", "fixed", "proc-h2"},
		{"upstream-process/h2c/pid", "h2c", "pid", "proc-h2"},
		{"nethttp-server/std/fixed", "std", "fixed", "nethttp"},
		{"nethttp-server/h1/fixed", "h1", "fixed", "nethttp"},
		{"nethttp-server/h2c/fixed", "h2c", "fixed", "nethttp-h2c"},
	} {
		b.Run(v.name, func(b *testing.B) {
			var s benchServer
			switch v.server {
			case "nethttp", "nethttp-h2c":
				s = newHTTPServer(b, service, v.server == "nethttp-h2c")
			case "h2":
				s = newH2Server(b, service)
			case "proc-raw", "proc-loop", "proc-h2":
				s = newProcServer(b, strings.TrimPrefix(v.server, "proc-"), service)
			default:
				s = newRawServer(b, service, 0)
			}
			tr := v.transport
			if tr == "std-h2c" {
				tr = "std"
			}
			e := open(b, benchRegistry(b), "bench", benchConfigT(s.url(), inflight, v.alg, tr))
			if v.transport == "std-h2c" {
				// net/http's own h2c client: the figure internal/h2 has to beat.
				var p http.Protocols
				p.SetUnencryptedHTTP2(true)
				e.transport.Protocols = &p
			}
			warm := 20 * inflight // connections
			if v.alg != "fixed" {
				// About a second: the controller ramps from its initial limit
				// (MaxInFlight/4) in 100 ms windows; the run measures the steady state.
				warm = 400 * inflight
			}
			measureClosedLoop(b, s, e, inflight, warm)
			b.ReportMetric(float64(e.Metrics().Limit), "limit")
		})
	}
}

// measureClosedLoop warms e up with warm requests (connections, limiter), then runs the
// timed closed loop of inflight requests against s and reports throughput against the
// bound, latency and CPU.
func measureClosedLoop(b *testing.B, s benchServer, e *Endpoint, inflight, warm int) {
	closedLoop(b, e, inflight, warm)
	s.meanService()
	total := max(b.N, 4*inflight)
	cpu := startCPU()
	b.ResetTimer()
	el, h := closedLoop(b, e, inflight, total)
	b.StopTimer()
	reportThroughput(b, float64(total)/el.Seconds(), inflight, s.meanService(), h)
	cpu.report(b, total)
}

// benchServer is a loopback upstream that measures the service time it delivers.
type benchServer interface {
	url() string
	meanService() time.Duration
}

// httpServer is the benchmark upstream on net/http's server: the same 2 ms and the same
// response as rawServer, with net/http's per-request costs (a goroutine per connection that
// parses into a Request, a ResponseWriter, a background read to detect a closed peer).
type httpServer struct {
	srv      *httptest.Server
	served   atomic.Int64
	svcNanos atomic.Int64
}

func newHTTPServer(tb testing.TB, service time.Duration, h2c bool) *httpServer {
	s := &httpServer{}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		time.Sleep(service)
		s.svcNanos.Add(int64(time.Since(t0)))
		s.served.Add(1)
		h := w.Header()
		h["Content-Length"] = []string{"2"}
		h["Content-Type"] = []string{"text/plain"}
		w.Write(rawResponse[len(rawResponse)-2:])
	}))
	if h2c {
		var p http.Protocols
		p.SetHTTP1(true)
		p.SetUnencryptedHTTP2(true)
		s.srv.Config.Protocols = &p
	}
	s.srv.Start()
	tb.Cleanup(s.srv.Close)
	return s
}

func (s *httpServer) url() string { return s.srv.URL }

func (s *httpServer) meanService() time.Duration {
	n := s.served.Swap(0)
	ns := s.svcNanos.Swap(0)
	if n == 0 {
		return 0
	}
	return time.Duration(ns / n)
}

func reportThroughput(b *testing.B, achieved float64, inflight int, svc time.Duration, h Histogram) {
	bound := float64(inflight) / svc.Seconds()
	b.ReportMetric(achieved, "req/s")
	b.ReportMetric(bound, "bound_req/s")
	b.ReportMetric(achieved/bound, "achieved/bound")
	b.ReportMetric(float64(svc.Microseconds()), "service_µs")
	b.ReportMetric(float64(h.Quantile(0.5).Microseconds()), "p50_µs")
	b.ReportMetric(float64(h.Quantile(0.99).Microseconds()), "p99_µs")
	b.ReportMetric(float64(h.Quantile(0.99))/float64(svc), "p99/service")
	// The mean time a request spends outside the service (client, kernel, scheduling, both
	// ways). Little's law: achieved/bound = service / (service + wait), so ≥ 0.8 needs
	// wait ≤ service/4.
	b.ReportMetric(float64((h.Mean() - svc).Microseconds()), "wait_µs")
}

// rawLoop is closedLoop with the minimal client: n goroutines, each with its own connection.
func rawLoop(tb testing.TB, addr string, n, total int) (time.Duration, Histogram) {
	var left atomic.Int64
	left.Store(int64(total))
	var h histogram
	var wg sync.WaitGroup
	req := []byte("GET /x HTTP/1.1\r\nHost: bench\r\n\r\n")
	start := time.Now()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				tb.Error(err)
				return
			}
			defer c.Close()
			r := bufio.NewReader(c)
			buf := make([]byte, len(rawResponse))
			for left.Add(-1) >= 0 {
				t0 := time.Now()
				if _, err := c.Write(req); err != nil {
					tb.Error(err)
					return
				}
				if _, err := io.ReadFull(r, buf); err != nil {
					tb.Error(err)
					return
				}
				h.record(time.Since(t0))
			}
		}()
	}
	wg.Wait()
	return time.Since(start), h.snapshot()
}

// BenchmarkHops splits the raw client's round trip on rawServer into its parts, at several
// levels of concurrency: request hop (client write → server has read the head), service,
// response hop (server write → client has read the response). The hops are where the wait
// of the throughput benchmark comes from: DESIGN.md, "Why 0.8 is out of reach".
func BenchmarkHops(b *testing.B) {
	for _, inflight := range []int{4, 16, 64, 256} {
		b.Run("inflight="+strconv.Itoa(inflight), func(b *testing.B) {
			const service = 2 * time.Millisecond
			s := newRawServer(b, service, 0)
			s.hops = new(sync.Map)
			total := max(b.N, 20*inflight)
			var left atomic.Int64
			left.Store(int64(total))
			var reqHop, respHop, rtt atomic.Int64
			var n atomic.Int64
			var wg sync.WaitGroup
			req := []byte("GET /x HTTP/1.1\r\nHost: bench\r\n\r\n")
			cpu := startCPU()
			start := time.Now()
			for i := 0; i < inflight; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, err := net.Dial("tcp", s.ln.Addr().String())
					if err != nil {
						b.Error(err)
						return
					}
					defer c.Close()
					hop := &hopStamp{}
					s.hops.Store(c.LocalAddr().String(), hop)
					r := bufio.NewReader(c)
					buf := make([]byte, len(rawResponse))
					for k := 0; left.Add(-1) >= 0; k++ {
						t0 := int64(time.Since(hopEpoch))
						if _, err := c.Write(req); err != nil {
							b.Error(err)
							return
						}
						if _, err := io.ReadFull(r, buf); err != nil {
							b.Error(err)
							return
						}
						t4 := int64(time.Since(hopEpoch))
						if k >= 10 { // past the connection's warm-up
							reqHop.Add(hop.read.Load() - t0)
							respHop.Add(t4 - hop.wrote.Load())
							rtt.Add(t4 - t0)
							n.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			svc := s.meanService()
			m := float64(max(n.Load(), 1)) * 1e3
			b.ReportMetric(float64(reqHop.Load())/m, "req_hop_µs")
			b.ReportMetric(float64(respHop.Load())/m, "resp_hop_µs")
			b.ReportMetric(float64(svc.Microseconds()), "service_µs")
			b.ReportMetric(float64(rtt.Load())/m, "rtt_µs")
			b.ReportMetric(float64(total)/el.Seconds()/(float64(inflight)/svc.Seconds()), "achieved/bound")
			cpu.report(b, total)
		})
	}
}

// BenchmarkLatency: the same service at a load the machine can carry (64 in flight), where
// p99 shows the client's own overhead rather than CPU saturation.
func BenchmarkLatency(b *testing.B) {
	for _, tr := range []string{"std", "h1", "h2c"} {
		b.Run(tr, func(b *testing.B) {
			const inflight, service = 64, 2 * time.Millisecond
			var s benchServer = newRawServer(b, service, 0)
			if tr == "h2c" {
				s = newH2Server(b, service)
			}
			e := open(b, benchRegistry(b), "bench", benchConfigT(s.url(), inflight, "fixed", tr))
			measureClosedLoop(b, s, e, inflight, 10*inflight)
		})
	}
}

// BenchmarkFailFast: with the breaker open, a request fails without waiting for anything.
// Target: ≤ 1 ms from Do to done.
func BenchmarkFailFast(b *testing.B) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond) // a sick upstream: slow, then failing
		http.Error(w, "", http.StatusServiceUnavailable)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	cfg := benchConfig("http://"+ln.Addr().String(), 64, "fixed")
	cfg.Breaker = BreakerConfig{ConsecutiveFailures: 5, Cooldown: Duration(time.Hour)}
	e := open(b, benchRegistry(b), "bench", cfg)
	for i := 0; i < 5; i++ {
		do(b, e, context.Background(), "GET /x")
	}
	if Kind(do(b, e, context.Background(), "GET /x").Err) != KindBreakerOpen {
		b.Fatal("breaker did not open")
	}
	req, _ := ParseRequest([]byte("GET /x"))
	var h histogram
	var wg sync.WaitGroup
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		wg.Add(1)
		t0 := time.Now()
		e.Do(context.Background(), req, func(r Response) {
			h.record(time.Since(t0))
			if Kind(r.Err) != KindBreakerOpen {
				b.Errorf("got %v", r.Err)
			}
			wg.Done()
		})
		if i%64 == 63 {
			wg.Wait()
		}
	}
	wg.Wait()
	b.StopTimer()
	s := h.snapshot()
	b.ReportMetric(float64(s.Quantile(0.5).Microseconds()), "p50_µs")
	b.ReportMetric(float64(s.Quantile(0.99).Microseconds()), "p99_µs")
	b.ReportMetric(float64(s.Quantile(0.99))/float64(time.Millisecond), "p99/1ms")
}

// BenchmarkAdaptive: a loopback worker pool (16 workers, 2 ms) with 128 clients; after half
// the run the service time doubles. Prints the time series of each controller and reports
// the limit and throughput (as a fraction of the pool's capacity) after the step.
func BenchmarkAdaptive(b *testing.B) {
	total := 6 * time.Second
	if d, err := time.ParseDuration(os.Getenv("LOOKUP_ADAPTIVE_RUN")); err == nil {
		total = d
	}
	for _, alg := range []string{"gradient", "pid", "aimd", "fixed"} {
		b.Run(alg, func(b *testing.B) {
			const workers, service, users = 16, 2 * time.Millisecond, 128
			for i := 0; i < b.N; i++ {
				s := newRawServer(b, service, workers)
				cfg := benchConfig(s.url(), users, alg)
				e := open(b, benchRegistry(b), "bench", cfg)
				pts := runAdaptiveReal(b, e, s, users, total, 250*time.Millisecond, 2*service)
				fmt.Fprintf(os.Stderr, "BenchmarkAdaptive/%s: 16 workers, service 2ms → 4ms at %v, %d clients\n%s",
					alg, total/2, users, formatSeries(pts))
				// After the step: the last third of the run.
				var lim, frac, up float64
				var n int
				for _, p := range pts {
					if p.at > total*2/3 {
						lim += float64(p.limit)
						frac += p.throughput / p.capacity
						up += float64(p.upstream)
						n++
					}
				}
				b.ReportMetric(lim/float64(n), "limit_after")
				b.ReportMetric(frac/float64(n), "throughput/capacity_after")
				b.ReportMetric(up/float64(n)/1e6, "upstream_p50_ms_after")
				// Time from the step until throughput is back at 85% of the new capacity.
				rec := time.Duration(-1)
				for _, p := range pts {
					if p.at > total/2+250*time.Millisecond && p.throughput >= 0.85*p.capacity {
						rec = p.at - total/2
						break
					}
				}
				b.ReportMetric(rec.Seconds(), "recovery_s")
				e.Close()
			}
		})
	}
}

// runAdaptiveReal is runAdaptive on the wall clock, with a rawServer.
func runAdaptiveReal(tb testing.TB, e *Endpoint, s *rawServer, users int, total, every, slower time.Duration) []adaptPoint {
	req, _ := ParseRequest([]byte("GET /x"))
	var completed atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := 0; i < users; i++ {
		wg.Add(1)
		var loop func(Response)
		loop = func(r Response) {
			if r.Err != nil {
				tb.Errorf("request failed: %v", r.Err)
			}
			completed.Add(1)
			if stop.Load() {
				wg.Done()
				return
			}
			e.Do(context.Background(), req, loop)
		}
		e.Do(context.Background(), req, loop)
	}
	var pts []adaptPoint
	start := time.Now()
	var last int64
	prev := e.Metrics()
	s.meanService()
	for time.Since(start) < total {
		time.Sleep(every)
		svc := s.meanService()
		if time.Since(start) >= total/2 {
			s.service.Store(int64(slower))
		}
		m := e.Metrics()
		c := completed.Load()
		pt := adaptPoint{at: time.Since(start), limit: m.Limit, throughput: float64(c-last) / every.Seconds(),
			upstream: diffHist(m.Upstream, prev.Upstream).Quantile(0.5), e2e: diffHist(m.Latency, prev.Latency).Quantile(0.5)}
		if svc > 0 && s.workers != nil {
			pt.capacity = float64(cap(s.workers)) / svc.Seconds()
		}
		pts = append(pts, pt)
		last, prev = c, m
	}
	stop.Store(true)
	wg.Wait()
	return pts
}
