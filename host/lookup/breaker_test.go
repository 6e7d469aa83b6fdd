package lookup

import (
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sony/gobreaker/v2"
)

// memNet is an in-memory network for synctest bubbles: the client's DialFunc hands one end of
// a net.Pipe to an http.Server. Pipes block durably, so the bubble's fake clock advances while
// requests wait, and a 30 s cooldown passes instantly. The dialer still insists on 127.0.0.1.
type memNet struct {
	t     testing.TB
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	srv   *http.Server
	hits  atomic.Int64
}

func newMemNet(t testing.TB, h http.HandlerFunc) *memNet {
	n := &memNet{t: t, conns: make(chan net.Conn), done: make(chan struct{})}
	n.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.hits.Add(1)
		h(w, r)
	})}
	if testTransport == "h2c" {
		var p http.Protocols
		p.SetHTTP1(true)
		p.SetUnencryptedHTTP2(true)
		n.srv.Protocols = &p
	}
	go n.srv.Serve(n)
	t.Cleanup(func() { n.srv.Close() })
	return n
}

func (n *memNet) Accept() (net.Conn, error) {
	select {
	case c := <-n.conns:
		return c, nil
	case <-n.done:
		return nil, net.ErrClosed
	}
}

func (n *memNet) Close() error {
	n.once.Do(func() { close(n.done) })
	return nil
}

func (n *memNet) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 80} }

func (n *memNet) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		n.t.Errorf("memNet asked to dial %s", addr)
		return nil, syscall.ECONNREFUSED
	}
	c1, c2 := net.Pipe()
	select {
	case n.conns <- c2:
		return c1, nil
	case <-n.done:
		return nil, syscall.ECONNREFUSED
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// memConfig is testConfig for an endpoint on a memNet.
func memConfig() EndpointConfig { return testConfig("http://127.0.0.1:80") }

func TestBreakerTransitions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var failing atomic.Bool
		failing.Store(true)
		mn := newMemNet(t, func(w http.ResponseWriter, r *http.Request) {
			if failing.Load() {
				http.Error(w, "down", http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, "up")
		})
		cfg := memConfig()
		cfg.Retry.MaxAttempts = 1
		cfg.Breaker = BreakerConfig{ConsecutiveFailures: 3, Cooldown: Duration(30 * time.Second)}
		reg := NewRegistry(WithDialer(mn.dial))
		e := open(t, reg, "t1", cfg)

		for i := 0; i < 3; i++ {
			wantStatus(t, do(t, e, context.Background(), "GET /x"), 503, "down\n")
		}
		if m := e.Metrics(); m.Breaker != gobreaker.StateOpen || m.Transitions.ToOpen != 1 {
			t.Fatalf("after 3 failures: %v %+v", m.Breaker, m.Transitions)
		}
		// Open: fails at once, nothing sent.
		start := time.Now()
		wantKind(t, do(t, e, context.Background(), "GET /x"), KindBreakerOpen)
		if time.Since(start) != 0 || mn.hits.Load() != 3 {
			t.Fatalf("open breaker: took %v, %d hits", time.Since(start), mn.hits.Load())
		}
		// Still open just before the cooldown ends.
		time.Sleep(30*time.Second - time.Millisecond)
		wantKind(t, do(t, e, context.Background(), "GET /x"), KindBreakerOpen)
		time.Sleep(2 * time.Millisecond)
		if s := e.Metrics().Breaker; s != gobreaker.StateHalfOpen {
			t.Fatalf("after cooldown: %v", s)
		}
		// Half-open: a failing probe reopens it.
		wantStatus(t, do(t, e, context.Background(), "GET /x"), 503, "down\n")
		if s := e.Metrics().Breaker; s != gobreaker.StateOpen {
			t.Fatalf("after failed probe: %v", s)
		}
		time.Sleep(30*time.Second + time.Millisecond)
		failing.Store(false)
		wantStatus(t, do(t, e, context.Background(), "GET /x"), 200, "up")
		m := e.Metrics()
		if m.Breaker != gobreaker.StateClosed || m.Transitions != (BreakerTransitions{ToOpen: 2, ToHalfOpen: 2, ToClosed: 1}) {
			t.Fatalf("after good probe: %v %+v", m.Breaker, m.Transitions)
		}
		if m.ErrorsOf(KindBreakerOpen) != 2 || mn.hits.Load() != 5 {
			t.Fatalf("breaker-open errors %d, hits %d", m.ErrorsOf(KindBreakerOpen), mn.hits.Load())
		}
	})
}

// Timeouts and resets count as failures; a 4xx, a refusal or a too-large body does not.
func TestBreakerCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mn := newMemNet(t, func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/slow":
				time.Sleep(time.Second)
			case "/404":
				http.Error(w, "", 404)
			case "/big":
				io.WriteString(w, strings.Repeat("x", 2000))
			}
		})
		cfg := memConfig()
		cfg.Timeout = Duration(100 * time.Millisecond)
		cfg.MaxResponseBytes = 1000
		cfg.Retry.MaxAttempts = 1
		cfg.Breaker = BreakerConfig{ConsecutiveFailures: 2}
		e := open(t, NewRegistry(WithDialer(mn.dial)), "t1", cfg)
		for i := 0; i < 5; i++ {
			wantStatus(t, do(t, e, context.Background(), "GET /404"), 404, "")
			wantKind(t, do(t, e, context.Background(), "GET /big"), KindTooLarge)
			wantKind(t, do(t, e, context.Background(), "GET /../x"), KindRefused)
		}
		if s := e.Metrics().Breaker; s != gobreaker.StateClosed {
			t.Fatalf("breaker %v after non-failures", s)
		}
		wantKind(t, do(t, e, context.Background(), "GET /slow"), KindTimeout)
		wantKind(t, do(t, e, context.Background(), "GET /slow"), KindTimeout)
		if s := e.Metrics().Breaker; s != gobreaker.StateOpen {
			t.Fatalf("breaker %v after two timeouts", s)
		}
		time.Sleep(2 * time.Second) // let the abandoned handlers finish
	})
}

// One breaker per (tenant, endpoint): pipelines of a tenant share it, other tenants do not.
func TestBreakerSharedPerTenant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mn := newMemNet(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "", 500) })
		cfg := memConfig()
		cfg.Retry.MaxAttempts = 1
		cfg.Breaker = BreakerConfig{ConsecutiveFailures: 2}
		reg := NewRegistry(WithDialer(mn.dial))
		pipeA := open(t, reg, "acme", cfg)
		pipeB := open(t, reg, "acme", cfg)
		other := open(t, reg, "globex", cfg)
		do(t, pipeA, context.Background(), "GET /")
		do(t, pipeB, context.Background(), "GET /")
		for _, e := range []*Endpoint{pipeA, pipeB} {
			if s := e.Metrics().Breaker; s != gobreaker.StateOpen {
				t.Fatalf("acme breaker %v after one failure from each pipeline", s)
			}
		}
		wantKind(t, do(t, pipeA, context.Background(), "GET /"), KindBreakerOpen)
		if s := other.Metrics().Breaker; s != gobreaker.StateClosed {
			t.Fatalf("other tenant's breaker %v", s)
		}
		wantStatus(t, do(t, other, context.Background(), "GET /"), 500, "")
		// Closing every endpoint that uses a breaker forgets it.
		pipeA.Close()
		pipeB.Close()
		pipeC := open(t, reg, "acme", cfg)
		if s := pipeC.Metrics().Breaker; s != gobreaker.StateClosed {
			t.Fatalf("new acme endpoint got breaker %v", s)
		}
	})
}

// Retries wait on timers: the backoff schedule holds in fake time exactly, and while a request
// waits out its backoff no goroutine of this package exists for it.
func TestRetryBackoffHoldsNoGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		mn := newMemNet(t, func(w http.ResponseWriter, r *http.Request) {
			if n.Add(1) <= 3 {
				http.Error(w, "", http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, "ok")
		})
		cfg := memConfig()
		zero := 0.0
		cfg.Retry = RetryPolicy{MaxAttempts: 4, InitialBackoff: Duration(100 * time.Millisecond),
			MaxBackoff: Duration(time.Second), Multiplier: 3, Jitter: &zero}
		e := open(t, NewRegistry(WithDialer(mn.dial)), "t1", cfg)
		req, _ := ParseRequest([]byte("GET /x"))
		start := time.Now()
		got := make(chan Response, 1)
		e.Do(context.Background(), req, func(r Response) { got <- r })

		synctest.Wait() // first attempt done; waiting 100ms
		if stacks := packageGoroutines(); stacks != "" {
			t.Fatalf("goroutines of host/lookup during backoff:\n%s", stacks)
		}
		r := <-got
		wantStatus(t, r, 200, "ok")
		if el := time.Since(start); el != 100*time.Millisecond+300*time.Millisecond+900*time.Millisecond {
			t.Fatalf("three backoffs took %v, want 1.3s", el)
		}
		if m := e.Metrics(); m.Retries != 3 || m.Attempts != 4 {
			t.Fatalf("retries %d attempts %d", m.Retries, m.Attempts)
		}

		// Retry-After stretches the backoff; beyond max_backoff the response is returned.
		n.Store(-100)
		mn2 := newMemNet(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", r.URL.Query().Get("ra"))
			http.Error(w, "", http.StatusTooManyRequests)
		})
		cfg.Name = "ra"
		e2 := open(t, NewRegistry(WithDialer(mn2.dial)), "t1", cfg)
		start = time.Now()
		wantStatus(t, do(t, e2, context.Background(), "GET /x?ra=60"), 429, "")
		if el := time.Since(start); el != 0 {
			t.Fatalf("Retry-After 60 > max_backoff: waited %v", el)
		}
		start = time.Now()
		wantStatus(t, do(t, e2, context.Background(), "GET /x?ra=1"), 429, "")
		if el := time.Since(start); el != 3*time.Second {
			t.Fatalf("Retry-After 1 on three retries: waited %v, want 3s", el)
		}
	})
}

// packageGoroutines returns the stacks of goroutines running code of this package, other
// than the test itself.
func packageGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "lookup.(*call)") || strings.Contains(g, "lookup.(*Endpoint)") || strings.Contains(g, "lookup.(*limiter)") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// Cancelling a request that waits out a backoff ends it at once.
func TestCancelDuringBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mn := newMemNet(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "", http.StatusServiceUnavailable) })
		cfg := memConfig()
		cfg.Retry.InitialBackoff = Duration(10 * time.Second)
		cfg.Retry.MaxBackoff = Duration(10 * time.Second)
		e := open(t, NewRegistry(WithDialer(mn.dial)), "t1", cfg)
		req, _ := ParseRequest([]byte("GET /x"))
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan Response, 1)
		e.Do(ctx, req, func(r Response) { got <- r })
		synctest.Wait()
		start := time.Now()
		cancel()
		wantKind(t, <-got, KindCancelled)
		if time.Since(start) != 0 || mn.hits.Load() != 1 {
			t.Fatalf("cancel took %v, %d hits", time.Since(start), mn.hits.Load())
		}
		// The queued-timer path: a request in the limiter queue times out after queue_timeout.
	})
}

func TestQueueTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mn := newMemNet(t, func(w http.ResponseWriter, r *http.Request) { time.Sleep(time.Second) })
		cfg := memConfig()
		cfg.MaxInFlight = 1
		cfg.Timeout = Duration(5 * time.Second)
		cfg.QueueTimeout = Duration(300 * time.Millisecond)
		cfg.SingleFlight = "off"
		cfg.Concurrency.Algorithm = "fixed"
		e := open(t, NewRegistry(WithDialer(mn.dial)), "t1", cfg)
		req, _ := ParseRequest([]byte("GET /x"))
		got := make(chan Response, 3)
		start := time.Now()
		for i := 0; i < 3; i++ {
			e.Do(context.Background(), req, func(r Response) { got <- r })
		}
		r1, r2 := <-got, <-got
		wantKind(t, r1, KindTimeout)
		wantKind(t, r2, KindTimeout)
		if el := time.Since(start); el != 300*time.Millisecond {
			t.Fatalf("queued requests timed out after %v", el)
		}
		wantStatus(t, <-got, 200, "")
		if el := time.Since(start); el != time.Second {
			t.Fatalf("in-flight request took %v", el)
		}
	})
}

// TestRegistryBreakers: Registry.Breakers lists a tenant's shared breakers with their state,
// and none of another tenant's.
func TestRegistryBreakers(t *testing.T) {
	r := NewRegistry()
	cfg := EndpointConfig{Name: "geo", BaseURL: "http://127.0.0.1:9", Egress: EgressPolicy{AllowLoopback: true}}
	a, err := r.Open("acme", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := r.Open("other", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := r.Breakers("acme")
	if len(got) != 1 || got[0].Endpoint != "geo" || got[0].State != "closed" || got[0].Origin != "http://127.0.0.1:9" {
		t.Fatalf("acme's breakers: %+v", got)
	}
}
