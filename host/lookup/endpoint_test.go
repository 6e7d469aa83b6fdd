package lookup

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/h2"
	"github.com/sony/gobreaker/v2"
)

func TestDoGet(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.RequestURI(), r.Header.Get("Accept"))
	})
	cfg := testConfig(s.URL + "/api")
	cfg.PathPrefix = "/v1"
	e := open(t, testRegistry(t), "t1", cfg)

	_, isH2 := e.primary.(*h2.Transport)
	_, isH1 := e.primary.(h1Transport)
	if isH1 != (testTransport == "" || testTransport == "h1") || isH2 != (testTransport == "h2c") || (e.primary == nil) != (testTransport == "std") {
		t.Fatalf("transport %q: h1 in use = %v, h2c in use = %v", testTransport, isH1, isH2)
	}
	r := do(t, e, context.Background(), "GET /v1/geo?ip=1.2.3.4\nAccept: text/plain\n")
	wantStatus(t, r, 200, "GET /api/v1/geo?ip=1.2.3.4 text/plain")
	r = do(t, e, context.Background(), "HEAD /v1/x")
	wantStatus(t, r, 200, "")
	r = do(t, e, context.Background(), "POST /v1/p\n\nhello")
	wantStatus(t, r, 200, "POST /api/v1/p ")
	m := e.Metrics()
	if m.Requests != 3 || m.Attempts != 3 || m.Statuses[2] != 3 || m.Latency.Count != 3 {
		t.Fatalf("metrics %+v", m)
	}
}

func TestStatusIsResponseAfterRetries(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/404":
			http.Error(w, "nope", 404)
		case "/503":
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}
	})
	e := open(t, testRegistry(t), "t1", testConfig(s.URL))
	wantStatus(t, do(t, e, context.Background(), "GET /404"), 404, "nope\n")
	if n := s.hits("/404"); n != 1 {
		t.Fatalf("404 sent %d times, want 1", n)
	}
	wantStatus(t, do(t, e, context.Background(), "GET /503"), 503, "busy\n")
	if n := s.hits("/503"); n != 3 {
		t.Fatalf("503 sent %d times, want 3 (max_attempts)", n)
	}
	// POST is not idempotent: a 503 after it was sent is not retried.
	wantStatus(t, do(t, e, context.Background(), "POST /503"), 503, "busy\n")
	if n := s.hits("/503"); n != 4 {
		t.Fatalf("POST /503 retried: %d hits", n-3)
	}
	if m := e.Metrics(); m.Retries != 2 || m.Statuses[5] != 2 || m.Statuses[4] != 1 {
		t.Fatalf("metrics: retries %d statuses %v", m.Retries, m.Statuses)
	}
}

func TestRetryAfterReset(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) <= 2 {
			hijackClose(w)
			return
		}
		io.WriteString(w, "ok")
	})
	e := open(t, testRegistry(t), "t1", testConfig(s.URL))
	wantStatus(t, do(t, e, context.Background(), "GET /x"), 200, "ok")
	if m := e.Metrics(); m.Attempts != 3 || m.Retries != 2 {
		t.Fatalf("attempts %d retries %d, want 3 and 2", m.Attempts, m.Retries)
	}
	// Resets on every attempt: unavailable after max_attempts.
	n.Store(-100)
	wantKind(t, do(t, e, context.Background(), "GET /y"), KindUnavailable)
	// 3 attempts; net/http may add one replay of an idempotent request on a reused
	// keep-alive connection that was reset.
	if h := s.hits("/y"); h < 3 || h > 4 {
		t.Fatalf("/y sent %d times", h)
	}
}

func TestNonIdempotentRetry(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		hijackClose(w)
	})
	reg := testRegistry(t)
	e := open(t, reg, "t1", testConfig(s.URL))
	// The request reached the server: a POST must not be repeated.
	wantKind(t, do(t, e, context.Background(), "POST /p\n\nbody"), KindUnavailable)
	if h := s.hits("/p"); h != 1 {
		t.Fatalf("POST sent %d times, want 1", h)
	}
	// PUT is idempotent.
	wantKind(t, do(t, e, context.Background(), "PUT /put\n\nbody"), KindUnavailable)
	if h := s.hits("/put"); h != 3 {
		t.Fatalf("PUT sent %d times, want 3", h)
	}
	// Opted in.
	cfg := testConfig(s.URL)
	cfg.Name = "optin"
	cfg.Retry.RetryNonIdempotent = true
	e2 := open(t, reg, "t1", cfg)
	wantKind(t, do(t, e2, context.Background(), "POST /p2\n\nbody"), KindUnavailable)
	if h := s.hits("/p2"); h != 3 {
		t.Fatalf("opted-in POST sent %d times, want 3", h)
	}
}

func TestNonIdempotentRetryWhenNotSent(t *testing.T) {
	t.Parallel()
	// A port with no listener: the connection is refused, so the POST provably never left.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	e := open(t, testRegistry(t), "t1", testConfig("http://"+addr))
	wantKind(t, do(t, e, context.Background(), "POST /p\n\nbody"), KindUnavailable)
	if m := e.Metrics(); m.Attempts != 3 {
		t.Fatalf("attempts %d, want 3: a refused connection is safe to retry", m.Attempts)
	}
}

// In fake time: the attempt timeout, the backoff and the caller's deadline are exact there, so
// the elapsed times below are facts about the endpoint's logic, not about the machine's speed.
func TestTimeouts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var slowHits atomic.Int32
		mn := newMemNet(t, func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/slow":
				slowHits.Add(1)
				select {
				case <-time.After(2 * time.Second):
				case <-r.Context().Done():
				}
			case "/slowbody":
				w.Header().Set("Content-Length", "1000")
				w.WriteHeader(200)
				for i := 0; i < 100; i++ {
					w.Write([]byte("0123456789"))
					w.(http.Flusher).Flush()
					select {
					case <-time.After(20 * time.Millisecond):
					case <-r.Context().Done():
						return
					}
				}
			}
		})
		cfg := memConfig()
		cfg.Timeout = Duration(100 * time.Millisecond)
		cfg.Retry.MaxAttempts = 2
		e := open(t, NewRegistry(WithDialer(mn.dial)), "t1", cfg)
		start := time.Now()
		wantKind(t, do(t, e, context.Background(), "GET /slow"), KindTimeout)
		// Two attempts of 100ms and the 1ms backoff between them (no jitter).
		if el, want := time.Since(start), 2*100*time.Millisecond+time.Millisecond; el != want {
			t.Fatalf("two timed-out attempts took %v, want %v", el, want)
		}
		if h := slowHits.Load(); h != 2 {
			t.Fatalf("/slow sent %d times, want 2", h)
		}
		start = time.Now()
		wantKind(t, do(t, e, context.Background(), "GET /slowbody"), KindTimeout)
		if el := time.Since(start); el != 201*time.Millisecond { // the timeout covers the body
			t.Fatalf("two attempts on a slow body took %v, want 201ms", el)
		}

		// The caller's deadline is a timeout too, and ends the wait at once.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		cfg2 := cfg
		cfg2.Name, cfg2.Timeout = "long", Duration(5*time.Second)
		e = open(t, NewRegistry(WithDialer(mn.dial)), "t1", cfg2)
		start = time.Now()
		wantKind(t, do(t, e, ctx, "GET /slow?caller"), KindTimeout)
		if el := time.Since(start); el != 30*time.Millisecond {
			t.Fatalf("caller deadline took %v to report, want 30ms", el)
		}
	})
}

// In a synctest bubble, so that "the server has stopped streaming" is a fact to wait for
// (synctest.Wait: every handler has returned or is blocked) rather than a sleep.
func TestResponseTooLarge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		chunk := strings.Repeat("x", 64<<10)
		var streamed atomic.Int64
		mn := newMemNet(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/cl" {
				w.Header().Set("Content-Length", fmt.Sprint(100<<20))
			}
			for i := 0; i < 1600; i++ { // 100 MiB if nobody stops us
				n, err := io.WriteString(w, chunk)
				streamed.Add(int64(n))
				if err != nil {
					return
				}
			}
		})
		cfg := memConfig()
		cfg.MaxResponseBytes = 1 << 20
		e := open(t, NewRegistry(WithDialer(mn.dial)), "t1", cfg)
		wantKind(t, do(t, e, context.Background(), "GET /chunked"), KindTooLarge)
		wantKind(t, do(t, e, context.Background(), "GET /cl"), KindTooLarge)
		if h := mn.hits.Load(); h != 2 {
			t.Fatalf("too-large responses were retried: %d requests", h)
		}
		// The limit is enforced while reading: far less than 100 MiB went over the wire.
		synctest.Wait()
		if n := streamed.Load(); n > 20<<20 {
			t.Fatalf("server streamed %d bytes before the client gave up", n)
		}
		if m := e.Metrics(); m.ErrorsOf(KindTooLarge) != 2 {
			t.Fatalf("too-large errors %d", m.ErrorsOf(KindTooLarge))
		}
	})
}

func TestInjectedHeadersAndPolicy(t *testing.T) {
	t.Setenv("LOOKUP_TEST_TOKEN", "s3cret")
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s|%s|%s", r.Header.Get("Authorization"), r.Header.Get("X-Tenant"), r.Header.Get("X-Guest"))
	})
	cfg := testConfig(s.URL)
	cfg.Methods = []string{"GET"}
	cfg.PathPrefix = "/v1"
	cfg.Headers = map[string]string{"Authorization": "Bearer ${env:LOOKUP_TEST_TOKEN}", "x-tenant": "a$$b"}
	e := open(t, testRegistry(t), "t1", cfg)
	wantStatus(t, do(t, e, context.Background(), "GET /v1/x\nX-Guest: g\n"), 200, "Bearer s3cret|a$b|g")
	for _, raw := range []string{
		"GET /v1/x\nAuthorization: mine\n", // injected: the guest may not override it
		"GET /v1/x\nx-tenant: t2\n",
		"GET /v1/x\nHost: evil\n",
		"GET /v1/x\nTransfer-Encoding: chunked\n",
		"GET /v1/x\nConnection: close\n",
		"POST /v1/x",      // method not allowed
		"GET /v2/x",       // outside the prefix
		"GET /v1/../v2/x", // escape
		"GET /v1/%2e%2e/v2",
		"GET /v1/a%2f..%2f..%2fv2",
		"GET /v1\\..\\v2",
	} {
		r := do(t, e, context.Background(), raw)
		wantKind(t, r, KindRefused)
		if r.Err.(*Error).Endpoint != "svc" {
			t.Errorf("error %v does not name the endpoint", r.Err)
		}
	}
	if h := s.total(); h != 1 {
		t.Fatalf("refused requests reached the server: %d requests", h)
	}
	if m := e.Metrics(); m.ErrorsOf(KindRefused) != 11 {
		t.Fatalf("refused count %d", m.ErrorsOf(KindRefused))
	}
	// The secret is not in the config the endpoint reports.
	if got := fmt.Sprintf("%+v", e.Config()); strings.Contains(got, "s3cret") {
		t.Fatalf("config exposes the secret: %s", got)
	}
}

func TestSecretFileAndErrors(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/token"
	if err := writeFile(path, "file-secret\n"); err != nil {
		t.Fatal(err)
	}
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.Header.Get("X-Key")) })
	cfg := testConfig(s.URL)
	cfg.Headers = map[string]string{"X-Key": "${file:" + path + "}"}
	e := open(t, testRegistry(t), "t1", cfg)
	wantStatus(t, do(t, e, context.Background(), "GET /"), 200, "file-secret")

	for _, v := range []string{"${env:LOOKUP_TEST_UNSET_VAR}", "${file:" + dir + "/missing}", "${vault:x}", "$x", "${env:"} {
		cfg.Headers = map[string]string{"X-Key": v}
		if _, err := testRegistry(t).Open("t1", cfg); err == nil {
			t.Errorf("header value %q accepted", v)
		}
	}
}

func TestSingleFlight(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		io.WriteString(w, "shared")
	})
	e := open(t, testRegistry(t), "t1", testConfig(s.URL))
	const n = 50
	var wg sync.WaitGroup
	results := make(chan Response, n)
	req, _ := ParseRequest([]byte("GET /a/./b?q=1"))
	req2, _ := ParseRequest([]byte("GET /a/b?q=1")) // same after normalisation
	for i := 0; i < n; i++ {
		wg.Add(1)
		r := req
		if i%2 == 1 {
			r = req2
		}
		e.Do(context.Background(), r, func(r Response) { results <- r; wg.Done() })
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.Metrics().SharedCalls < n-1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	close(results)
	for r := range results {
		wantStatus(t, r, 200, "shared")
	}
	if h := s.total(); h != 1 {
		t.Fatalf("%d identical requests made %d upstream calls, want 1", n, h)
	}
	// POST is not shared by default.
	wantStatus(t, do(t, e, context.Background(), "POST /a/b?q=1"), 200, "shared")
	if m := e.Metrics(); m.SharedCalls != n-1 || m.Attempts != 2 {
		t.Fatalf("shared %d attempts %d", m.SharedCalls, m.Attempts)
	}
}

func TestSingleFlightWaiterCancel(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
			io.WriteString(w, "ok")
		case <-r.Context().Done():
		}
	})
	e := open(t, testRegistry(t), "t1", testConfig(s.URL))
	req, _ := ParseRequest([]byte("GET /x"))
	ctx1, cancel1 := context.WithCancel(context.Background())
	r1 := make(chan Response, 1)
	r2 := make(chan Response, 1)
	e.Do(ctx1, req, func(r Response) { r1 <- r })
	e.Do(context.Background(), req, func(r Response) { r2 <- r })
	for s.total() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel1()
	wantKind(t, <-r1, KindCancelled)
	close(release)
	wantStatus(t, <-r2, 200, "ok") // the other waiter still gets the shared response
	if h := s.total(); h != 1 {
		t.Fatalf("%d upstream calls", h)
	}

	// When every waiter leaves, the upstream call is cancelled.
	release2 := make(chan struct{})
	s2 := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		close(release2)
	})
	e2 := open(t, testRegistry(t), "t1", testConfig(s2.URL))
	ctx, cancel := context.WithCancel(context.Background())
	r3 := make(chan Response, 1)
	e2.Do(ctx, req, func(r Response) { r3 <- r })
	for s2.total() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	wantKind(t, <-r3, KindCancelled)
	select {
	case <-release2:
	case <-time.After(5 * time.Second):
		t.Fatal("upstream request not cancelled after its last waiter left")
	}
}

// In fake time, so that the TTL cannot expire early on a slow machine.
func TestCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		mn := newMemNet(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/missing" {
				http.Error(w, "no", 404)
				return
			}
			fmt.Fprintf(w, "v%d", n.Add(1))
		})
		cfg := memConfig()
		cfg.Cache = &CacheConfig{TTL: Duration(150 * time.Millisecond), MaxEntries: 2}
		e := open(t, NewRegistry(WithDialer(mn.dial)), "t1", cfg)
		wantStatus(t, do(t, e, context.Background(), "GET /a"), 200, "v1")
		time.Sleep(149 * time.Millisecond)
		wantStatus(t, do(t, e, context.Background(), "GET /a"), 200, "v1")
		wantStatus(t, do(t, e, context.Background(), "GET /a\nAccept: x\n"), 200, "v2") // different request
		wantStatus(t, do(t, e, context.Background(), "POST /a"), 200, "v3")             // not cached
		wantStatus(t, do(t, e, context.Background(), "POST /a"), 200, "v4")
		wantStatus(t, do(t, e, context.Background(), "GET /missing"), 404, "")
		wantStatus(t, do(t, e, context.Background(), "GET /missing"), 404, "")
		if h := mn.hits.Load(); h != 6 {
			t.Fatalf("%d upstream requests, want 6 (404 is not cached)", h)
		}
		time.Sleep(2 * time.Millisecond)
		wantStatus(t, do(t, e, context.Background(), "GET /a"), 200, "v5") // expired
		// LRU bound: 3 distinct keys in a 2-entry cache.
		do(t, e, context.Background(), "GET /b")
		do(t, e, context.Background(), "GET /c")
		if l := e.cache.len(); l != 2 {
			t.Fatalf("cache holds %d entries, max 2", l)
		}
		if m := e.Metrics(); m.CacheHits != 1 {
			t.Fatalf("cache hits %d, want 1", m.CacheHits)
		}
	})
}

// The upstream holds every request until all Do calls have returned: were Do to block on a
// full limiter, the loop below could never finish (its slots free only on release).
func TestQueueBoundsConcurrency(t *testing.T) {
	t.Parallel()
	var cur, peak atomic.Int32
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	defer releaseAll()
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		c := cur.Add(1)
		for {
			p := peak.Load()
			if c <= p || peak.CompareAndSwap(p, c) {
				break
			}
		}
		<-release
		cur.Add(-1)
	})
	cfg := testConfig(s.URL)
	cfg.MaxInFlight = 3
	cfg.MaxQueued = 5
	cfg.SingleFlight = "off"
	cfg.Concurrency.Algorithm = "fixed"
	e := open(t, testRegistry(t), "t1", cfg)
	req, _ := ParseRequest([]byte("GET /x"))
	const n = 20
	results := make(chan Response, n)
	issued := make(chan struct{})
	go func() {
		for i := 0; i < n; i++ {
			e.Do(context.Background(), req, func(r Response) { results <- r })
		}
		close(issued)
	}()
	select {
	case <-issued:
	case <-time.After(10 * time.Second): // a hang detector, not a speed check
		t.Fatal("Do blocked while the limiter was full")
	}
	var ok, full int
	for i := 0; i < n; i++ {
		if i == n-8 { // the 12 queue-full answers came at once, without the upstream
			releaseAll()
		}
		var r Response
		select {
		case r = <-results:
		case <-time.After(10 * time.Second):
			t.Fatalf("after %d ok and %d queue-full, no answer without the upstream: want 12 queue-full at once", ok, full)
		}
		switch {
		case r.Err == nil:
			ok++
		case Kind(r.Err) == KindUnavailable:
			full++
		default:
			t.Fatalf("unexpected %v", r.Err)
		}
	}
	if ok != 8 || full != 12 || peak.Load() > 3 {
		t.Fatalf("ok %d queue-full %d peak %d; want 8 (3 in flight + 5 queued), 12, <= 3", ok, full, peak.Load())
	}
}

// Not parallel: it checks that no goroutine of this package is left, process-wide.
func TestCloseCancelsEverything(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	cfg := testConfig(s.URL)
	cfg.MaxInFlight = 2
	cfg.SingleFlight = "off"
	cfg.Concurrency.Algorithm = "fixed"
	e, err := testRegistry(t).Open("t1", cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := ParseRequest([]byte("GET /x"))
	results := make(chan Response, 10)
	for i := 0; i < 10; i++ {
		e.Do(context.Background(), req, func(r Response) { results <- r })
	}
	for s.total() < 2 {
		time.Sleep(time.Millisecond)
	}
	e.Close() // returns only after every done ran
	if len(results) != 10 {
		t.Fatalf("%d of 10 done callbacks ran before Close returned", len(results))
	}
	for i := 0; i < 10; i++ {
		wantKind(t, <-results, KindCancelled)
	}
	wantKind(t, do(t, e, context.Background(), "GET /x"), KindCancelled)
	// Nothing of the endpoint is left running.
	deadline := time.Now().Add(2 * time.Second)
	for packageGoroutines() != "" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if g := packageGoroutines(); g != "" {
		t.Fatalf("goroutines left after Close:\n%s", g)
	}
}

func TestErrorKinds(t *testing.T) {
	codes := map[ErrorKind]int32{KindNone: 0, KindTimeout: -16, KindBreakerOpen: -17, KindTooLarge: -18,
		KindRefused: -19, KindUnavailable: -20, KindCancelled: -21}
	for k, c := range codes {
		if k.ABICode() != c {
			t.Errorf("%v.ABICode() = %d, want %d", k, k.ABICode(), c)
		}
	}
	err := fmt.Errorf("wrapped: %w", &Error{Kind: KindTimeout, Reason: "x"})
	if Kind(err) != KindTimeout || !IsRetryable(err) {
		t.Fatal("kind lost through wrapping")
	}
	if !errorsIs(err, ErrTimeout) || errorsIs(err, ErrRefused) {
		t.Fatal("sentinel matching by kind")
	}
	if Kind(context.Canceled) != KindCancelled || Kind(context.DeadlineExceeded) != KindTimeout || Kind(io.EOF) != KindUnavailable {
		t.Fatal("foreign errors")
	}
}

// TestLenientUpstream: an upstream whose responses net/http reads (bare-LF line ends,
// obs-fold, Transfer-Encoding with Content-Length) is read by every transport; under h1 it
// used to fail every lookup and open the breaker.
func TestLenientUpstream(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	answers := []string{
		"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
		"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n2\r\nok\r\n0\r\n\r\n",
	}
	var n atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					if _, err := io.WriteString(c, answers[int(n.Add(1))%len(answers)]); err != nil {
						return
					}
				}
			}()
		}
	}()
	cfg := testConfig("http://" + ln.Addr().String())
	if cfg.Transport == "h2c" {
		t.Skip("an HTTP/1.1 upstream")
	}
	e := open(t, testRegistry(t), "t1", cfg)
	for i := range 20 {
		if r := do(t, e, context.Background(), "GET /x"+strconv.Itoa(i)); r.Err != nil || r.Status != 200 || string(r.Body) != "ok" {
			t.Fatalf("lookup %d: %d %q %v", i, r.Status, r.Body, r.Err)
		}
	}
	if m := e.Metrics(); m.Attempts != 20 || m.Breaker != gobreaker.StateClosed || m.Transitions.ToOpen != 0 {
		t.Fatalf("%d attempts, breaker %v (%d openings): want 20 and closed", m.Attempts, m.Breaker, m.Transitions.ToOpen)
	}
}
