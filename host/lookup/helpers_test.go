package lookup

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// loopbackOnly returns a dialer that fails the test if it is ever asked to connect anywhere
// but 127.0.0.1, and records every address it dialled. Every test registry uses it: the
// egress policy must have refused anything else before the dialer is reached.
func loopbackOnly(t testing.TB) (DialFunc, func() []string) {
	var mu sync.Mutex
	var dialled []string
	d := &net.Dialer{Timeout: 5 * time.Second}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil || host != "127.0.0.1" {
			t.Errorf("dialer asked to connect to %q: only 127.0.0.1 is allowed", addr)
			return nil, errors.New("test dialer: refused non-loopback address")
		}
		mu.Lock()
		dialled = append(dialled, addr)
		mu.Unlock()
		return d.DialContext(ctx, network, addr)
	}
	return dial, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), dialled...)
	}
}

func testRegistry(t testing.TB, opts ...Option) *Registry {
	dial, _ := loopbackOnly(t)
	return NewRegistry(append([]Option{WithDialer(dial)}, opts...)...)
}

// testTransport is the transport the tests run with: the default unless
// LOOKUP_TEST_TRANSPORT says otherwise. TestOtherTransport runs the suite again with the others.
var testTransport = os.Getenv("LOOKUP_TEST_TRANSPORT")

// testConfig is a loopback endpoint with fast retries.
func testConfig(baseURL string) EndpointConfig {
	j := 0.0
	return EndpointConfig{
		Name:      "svc",
		BaseURL:   baseURL,
		Transport: testTransport,
		Methods:   []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"},
		Timeout:   Duration(2 * time.Second),
		Retry:     RetryPolicy{InitialBackoff: Duration(time.Millisecond), MaxBackoff: Duration(5 * time.Millisecond), Jitter: &j},
		Egress:    EgressPolicy{AllowLoopback: true},
	}
}

func open(t testing.TB, r *Registry, tenant string, cfg EndpointConfig) *Endpoint {
	t.Helper()
	e, err := r.Open(tenant, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// do runs one request synchronously (for tests).
func do(t testing.TB, e *Endpoint, ctx context.Context, raw string) Response {
	t.Helper()
	req, err := ParseRequest([]byte(raw))
	if err != nil {
		return Response{Err: err}
	}
	ch := make(chan Response, 1)
	// Do promises never to call done before it returns: done takes a lock held around Do,
	// so a synchronous call would deadlock (and the test time out).
	var mu sync.Mutex
	mu.Lock()
	e.Do(ctx, req, func(r Response) {
		mu.Lock()
		defer mu.Unlock()
		ch <- r
	})
	mu.Unlock()
	return awaitResponse(t, ch, raw)
}

// awaitResponse waits for the response to raw on ch, failing the test after 20 s (a hang,
// not a timing assertion).
func awaitResponse(t testing.TB, ch <-chan Response, raw string) Response {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(20 * time.Second):
		t.Fatalf("no response to %q", raw)
		return Response{}
	}
}

func wantKind(t testing.TB, r Response, k ErrorKind) {
	t.Helper()
	if Kind(r.Err) != k {
		t.Fatalf("got status %d err %v, want kind %v", r.Status, r.Err, k)
	}
}

func wantStatus(t testing.TB, r Response, status int, body string) {
	t.Helper()
	if r.Err != nil || r.Status != status || (body != "" && string(r.Body) != body) {
		t.Fatalf("got status %d body %q err %v, want %d %q", r.Status, r.Body, r.Err, status, body)
	}
}

// server starts a loopback HTTP server; counting requests per path.
type server struct {
	*httptest.Server
	mu    sync.Mutex
	count map[string]int
}

func newServer(t testing.TB, h http.HandlerFunc) *server {
	s := &server{count: map[string]int{}}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.count[r.URL.Path]++
		s.mu.Unlock()
		h(w, r)
	}))
	if testTransport == "h2c" {
		var p http.Protocols
		p.SetHTTP1(true)
		p.SetUnencryptedHTTP2(true)
		s.Config.Protocols = &p
	}
	s.Start()
	if !strings.HasPrefix(s.URL, "http://127.0.0.1:") {
		t.Fatalf("test server not on 127.0.0.1: %s", s.URL)
	}
	t.Cleanup(s.Close)
	return s
}

func (s *server) hits(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count[path]
}

func (s *server) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.count {
		n += c
	}
	return n
}

// hijackClose drops the connection without a response (a reset, as the client sees it).
func hijackClose(w http.ResponseWriter) {
	if _, ok := w.(http.Hijacker); !ok {
		panic(http.ErrAbortHandler) // HTTP/2: the stream is reset instead
	}
	c, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0) // RST rather than FIN
	}
	c.Close()
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o600) }

func errorsIs(err, target error) bool { return errors.Is(err, target) }

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// TestOtherTransport runs this package's tests again, in a child process each, with the
// transports that are not the default ("std", net/http's, and "h2c",
// against servers that speak HTTP/2 too), so that
// all keep every behaviour the tests pin down: SSRF refusals, retries, timeouts,
// cancellation, Close.
func TestOtherTransport(t *testing.T) {
	if testing.Short() || testTransport != "" {
		t.Skip("short, or already running with a chosen transport")
	}
	for _, tr := range []string{"std", "h2c"} {
		t.Run(tr, func(t *testing.T) {
			t.Parallel()
			args := []string{"-test.run", "^Test", "-test.skip", "^TestOtherTransport$", "-test.count", "1"}
			if testing.Verbose() {
				args = append(args, "-test.v")
			}
			cmd := exec.Command(os.Args[0], args...)
			cmd.Env = append(os.Environ(), "LOOKUP_TEST_TRANSPORT="+tr)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("tests with transport %s: %v\n%s", tr, err, out)
			}
		})
	}
}
