package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// dialer counts the connections a transport opens and refuses anything but 127.0.0.1.
type dialer struct {
	t     testing.TB
	dials atomic.Int32
}

func (d *dialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		d.t.Errorf("dial %s: only 127.0.0.1 is allowed", addr)
		return nil, errors.New("refused")
	}
	d.dials.Add(1)
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

func newTransport(t testing.TB) (*Transport, *dialer) {
	d := &dialer{t: t}
	tr := &Transport{Dial: d.dial}
	t.Cleanup(tr.CloseIdleConnections)
	return tr, d
}

func get(t testing.TB, rt http.RoundTripper, method, url string, body string) (*http.Response, string, error) {
	t.Helper()
	var rb io.Reader
	if body != "" {
		rb = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rb)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), err
}

func TestAgainstNetHTTPServer(t *testing.T) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/chunked":
			w.Write([]byte("part1,"))
			w.(http.Flusher).Flush()
			w.Write([]byte("part2"))
		case "/empty":
			w.WriteHeader(204)
		case "/close":
			w.Header().Set("Connection", "close")
			io.WriteString(w, "bye")
		default:
			w.Header().Set("X-Echo", r.Header.Get("X-In"))
			fmt.Fprintf(w, "%s %s %s %q ua=%s cl=%d", r.Method, r.URL.RequestURI(), r.Host, b, r.UserAgent(), r.ContentLength)
		}
	}))
	defer s.Close()
	tr, d := newTransport(t)
	req, _ := http.NewRequest("GET", s.URL+"/a/b?q=1", nil)
	req.Header.Set("X-In", "v")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	host := strings.TrimPrefix(s.URL, "http://")
	if want := fmt.Sprintf(`GET /a/b?q=1 %s "" ua=Go-http-client/1.1 cl=0`, host); string(b) != want || resp.Header.Get("X-Echo") != "v" {
		t.Fatalf("got %q %v, want %q", b, resp.Header, want)
	}
	for i := 0; i < 5; i++ {
		_, got, err := get(t, tr, "POST", s.URL+"/p", "hello")
		if err != nil || got != fmt.Sprintf(`POST /p %s "hello" ua=Go-http-client/1.1 cl=5`, host) {
			t.Fatalf("POST: %q %v", got, err)
		}
		resp, got, err := get(t, tr, "GET", s.URL+"/chunked", "")
		if err != nil || got != "part1,part2" || resp.ContentLength != -1 || len(resp.TransferEncoding) != 1 {
			t.Fatalf("chunked: %q %v %+v", got, err, resp)
		}
		resp, got, err = get(t, tr, "HEAD", s.URL+"/x", "")
		if err != nil || got != "" || resp.StatusCode != 200 {
			t.Fatalf("HEAD: %q %v", got, err)
		}
		resp, _, err = get(t, tr, "GET", s.URL+"/empty", "")
		if err != nil || resp.StatusCode != 204 {
			t.Fatalf("204: %v", err)
		}
	}
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d connections for sequential requests, want 1 (keep-alive)", n)
	}
	// Connection: close is honoured: the next request needs a new connection.
	if _, got, err := get(t, tr, "GET", s.URL+"/close", ""); err != nil || got != "bye" {
		t.Fatalf("close: %q %v", got, err)
	}
	get(t, tr, "GET", s.URL+"/x", "")
	if n := d.dials.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 after Connection: close", n)
	}
}

func TestConcurrentKeepAlive(t *testing.T) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Millisecond)
		io.WriteString(w, r.URL.Path)
	}))
	defer s.Close()
	tr, d := newTransport(t)
	tr.MaxIdleConnsPerHost = 8
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				p := fmt.Sprintf("/g%d/%d", g, i)
				if _, got, err := get(t, tr, "GET", s.URL+p, ""); err != nil || got != p {
					t.Errorf("%s: %q %v", p, got, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := d.dials.Load(); n > 8 {
		t.Fatalf("%d connections for 8 concurrent clients", n)
	}
}

// rawServer answers requests with scripted bytes.
type rawServer struct {
	ln      net.Listener
	conns   atomic.Int32
	reqs    atomic.Int32
	mu      sync.Mutex
	perConn map[int]int // requests served per connection
}

// newRawServer serves request i (counted over all connections, from 0) with reply(i); a nil
// reply closes the connection.
func newRawServer(t testing.TB, reply func(i int) []byte) *rawServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln, perConn: map[int]int{}}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ci := int(s.conns.Add(1)) - 1
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					s.mu.Lock()
					s.perConn[ci]++
					s.mu.Unlock()
					out := reply(int(s.reqs.Add(1)) - 1)
					if out == nil {
						return
					}
					if _, err := c.Write(out); err != nil {
						return
					}
				}
			}()
		}
	}()
	return s
}

func (s *rawServer) url() string { return "http://" + s.ln.Addr().String() }

func (s *rawServer) served(conn int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perConn[conn]
}

func TestMalformedResponses(t *testing.T) {
	for name, raw := range map[string]string{
		"HTTP/2 line":           "HTTP/2 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"two-digit status":      "HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\nok",
		"space before colon":    "HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok",
		"NUL in value":          "HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: 2\r\n\r\nok",
		"CR in value":           "HTTP/1.1 200 OK\r\nX: a\rb\r\nContent-Length: 2\r\n\r\nok",
		"gzip TE":               "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"two CLs":               "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!",
		"CL list":               "HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok",
		"negative CL":           "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nok",
		"huge CL":               "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\nok",
		"bad chunk size":        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n",
		"chunk size overflow":   "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000002\r\nok\r\n0\r\n\r\n",
		"chunk without CRLF":    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX0\r\n\r\n",
		"chunk line bare LF":    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nok\r\n0\r\n\r\n",
		"truncated body":        "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok",
		"truncated chunked":     "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nok",
		"101":                   "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
		"empty":                 "",
		"garbage":               "hello\r\n\r\n",
		"leading empty line":    "\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"header too large":      "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 70<<10) + "\r\nContent-Length: 2\r\n\r\nok",
		"too many fields":       "HTTP/1.1 200 OK\r\n" + strings.Repeat("X: y\r\n", 200) + "Content-Length: 2\r\n\r\nok",
		"bad trailer":           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nbad trailer\r\n\r\n",
		"too many interim":      strings.Repeat("HTTP/1.1 103 Early Hints\r\n\r\n", 20) + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"chunk overhead":        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + strings.Repeat("1;"+strings.Repeat("e", 4000)+"\r\nx\r\n", 20) + "0\r\n\r\n",
		"TE on HTTP/1.0":        "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"no space after status": "HTTP/1.1 200OK\r\nContent-Length: 2\r\n\r\nok",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newRawServer(t, func(i int) []byte {
				if i > 0 {
					return []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
				return []byte(raw)
			})
			tr, d := newTransport(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second) // for truncations
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", s.url()+"/", nil)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				var b []byte
				b, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil {
					t.Fatalf("accepted: body %q", b)
				}
			}
			// The connection is never reused after a protocol error.
			if _, got, err := get(t, tr, "GET", s.url()+"/", ""); err != nil || got != "ok" {
				t.Fatalf("second request: %q %v", got, err)
			}
			if n, m := d.dials.Load(), s.served(0); n != 2 || m != 1 {
				t.Fatalf("%d dials, %d requests on the first connection: it was reused", n, m)
			}
		})
	}
}

func TestAcceptedResponses(t *testing.T) {
	for name, tc := range map[string]struct {
		raw, body string
		reuse     bool
	}{
		"content-length": {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "ok", true},
		"no reason":      {"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok", "ok", true},
		"empty reason":   {"HTTP/1.1 200 \r\nContent-Length: 2\r\n\r\nok", "ok", true},
		"same CL twice":  {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\nok", "ok", true},
		"chunked":        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n2;ext=1\r\nok\r\nA\r\n0123456789\r\n0\r\n\r\n", "ok0123456789", true},
		"trailers":       {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Sum: 1\r\n\r\n", "ok", true},
		"interim":        {"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "ok", true},
		"close":          {"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\nok", "ok", false},
		"HTTP/1.0":       {"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", "ok", false},
		"until close":    {"HTTP/1.1 200 OK\r\n\r\nuntil the end", "until the end", false},
		"extra bytes":    {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", "ok", false},
		"204 with CL":    {"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", "", true},
		"304":            {"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n", "", true},
		"obs-text value": {"HTTP/1.1 200 OK\r\nX: caf\xc3\xa9\t\r\nContent-Length: 2\r\n\r\nok", "ok", true},
		"chunk size OWS": {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0000000000000002;a=\x01 \t\r\nok\r\n0\r\n\r\n", "ok", true},
		// What the one-pass parser refuses and net/http reads: read the same way as
		// http.ReadResponse (FuzzResponse's seeds hold them: it compares), on a connection never
		// reused.
		"bare LF":             {"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", "ok", false},
		"obs-fold":            {"HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 2\r\n\r\nok", "ok", false},
		"TE and CL":           {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\nok\r\n0\r\n\r\n", "ok", false},
		"HTTP/1.2":            {"HTTP/1.2 200 OK\r\nContent-Length: 2\r\n\r\nok", "ok", false},
		"status 600":          {"HTTP/1.1 600 X\r\nContent-Length: 2\r\n\r\nok", "ok", false},
		"reason with control": {"HTTP/1.1 200 O\x01K\r\nContent-Length: 2\r\n\r\nok", "ok", false},
		"trailer obs-fold":    {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nT: a\r\n b\r\n\r\n", "ok", true},
		"bare LF interim":     {"HTTP/1.1 100 Continue\n\nHTTP/1.1 200 OK\nContent-Length: 2\n\nok", "ok", false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var s *rawServer
			if strings.HasSuffix(tc.raw, "until the end") {
				s = newRawServerClosing(t, tc.raw) // the server must close to end the body
			} else {
				s = newRawServer(t, func(int) []byte { return []byte(tc.raw) })
			}
			tr, d := newTransport(t)
			for i := 0; i < 2; i++ {
				_, got, err := get(t, tr, "GET", s.url()+"/", "")
				if err != nil || got != tc.body {
					t.Fatalf("request %d: %q %v, want %q", i, got, err, tc.body)
				}
			}
			want := int32(2)
			if tc.reuse {
				want = 1
			}
			if n := d.dials.Load(); n != want {
				t.Fatalf("%d dials, want %d", n, want)
			}
		})
	}
}

// newRawServerClosing writes raw and closes, on every connection.
func newRawServerClosing(t testing.TB, raw string) *rawServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				http.ReadRequest(bufio.NewReader(c))
				c.Write([]byte(raw))
				c.Close()
			}()
		}
	}()
	return &rawServer{ln: ln}
}

func TestBodyLimit(t *testing.T) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/cl" {
			w.Header().Set("Content-Length", "5000")
		}
		w.Write(bytes.Repeat([]byte("x"), 5000))
	}))
	defer s.Close()
	tr, _ := newTransport(t)
	tr.MaxBodyBytes = 4000
	for _, p := range []string{"/cl", "/chunked"} {
		_, _, err := get(t, tr, "GET", s.URL+p, "")
		if !errors.Is(err, ErrBodyTooLarge) {
			t.Fatalf("%s: %v, want ErrBodyTooLarge", p, err)
		}
	}
	tr.MaxBodyBytes = 5000
	for _, p := range []string{"/cl", "/chunked"} {
		if _, got, err := get(t, tr, "GET", s.URL+p, ""); err != nil || len(got) != 5000 {
			t.Fatalf("%s at the limit: %d bytes, %v", p, len(got), err)
		}
	}
}

func TestContextCancel(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slowbody" {
			w.Header().Set("Content-Length", "10")
			w.Write([]byte("12345"))
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer s.Close()
	tr, _ := newTransport(t)

	// Deadline while waiting for the head.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+"/slow", nil)
	_, err := tr.RoundTrip(req)
	// The connection's deadline is the context's, so the transport may see it pass a moment
	// before the context's own timer marks it done: check the error only.
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}

	// Cancel while reading the body.
	ctx2, cancel2 := context.WithCancel(context.Background())
	req, _ = http.NewRequestWithContext(ctx2, "GET", s.URL+"/slowbody", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(20*time.Millisecond, cancel2)
	_, err = io.ReadAll(resp.Body)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel during body: %v", err)
	}
	// Cancelled before sending: nothing is dialled.
	req, _ = http.NewRequestWithContext(ctx2, "GET", s.URL+"/x", nil)
	if _, err := tr.RoundTrip(req); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: %v", err)
	}
}

// A keep-alive connection the server closed while idle: an idempotent request is replayed
// once on a new connection; a request that cannot be replayed (POST) is checked with a
// peek before it is sent, and goes out on a new connection.
func TestStaleConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var reqs atomic.Int32
	closed := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { closed <- struct{}{} }()
				defer c.Close() // after one response, as an idle timeout would
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				reqs.Add(1)
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
			}()
		}
	}()
	url := "http://" + ln.Addr().String() + "/"
	tr, d := newTransport(t)
	for i, method := range []string{"GET", "GET", "POST", "PUT", "POST"} {
		if _, got, err := get(t, tr, method, url, "b"); err != nil || got != "ok" {
			t.Fatalf("%d %s: %q %v", i, method, got, err)
		}
		select { // the server has closed the connection the pool holds
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("server did not close")
		}
		time.Sleep(5 * time.Millisecond) // for its FIN to arrive
	}
	// Every request reached the server exactly once and each needed a new connection:
	// GET and PUT by replay after the dead one failed, POST by the peek.
	if n := reqs.Load(); n != 5 {
		t.Fatalf("server saw %d requests, want 5", n)
	}
	if n := d.dials.Load(); n != 5 {
		t.Fatalf("%d dials, want 5", n)
	}
}

func TestFallback(t *testing.T) {
	var fell atomic.Int32
	fb := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		fell.Add(1)
		return &http.Response{StatusCode: 299, Body: http.NoBody, Request: r}, nil
	})
	tr := &Transport{Dial: func(context.Context, string, string) (net.Conn, error) {
		t.Error("dialled for a request that should fall back")
		return nil, errors.New("no")
	}, Fallback: fb}
	reqs := []*http.Request{}
	add := func(method, url string, body io.Reader, f func(*http.Request)) {
		r, _ := http.NewRequest(method, url, body)
		if f != nil {
			f(r)
		}
		reqs = append(reqs, r)
	}
	add("GET", "https://127.0.0.1/x", nil, nil)
	add("POST", "http://127.0.0.1/x", strings.NewReader("x"), func(r *http.Request) { r.Header.Set("Expect", "100-continue") })
	add("POST", "http://127.0.0.1/x", io.MultiReader(strings.NewReader("x")), nil) // unknown length
	add("GET", "http://127.0.0.1/x", nil, func(r *http.Request) { r.Header.Set("Upgrade", "websocket") })
	add("CONNECT", "http://127.0.0.1/x", nil, nil)
	for _, r := range reqs {
		resp, err := tr.RoundTrip(r)
		if err != nil || resp.StatusCode != 299 {
			t.Fatalf("%s %s: %v", r.Method, r.URL, err)
		}
	}
	if fell.Load() != int32(len(reqs)) {
		t.Fatalf("fallback used %d times", fell.Load())
	}
	tr.Fallback = nil
	if _, err := tr.RoundTrip(reqs[0]); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("without fallback: %v", err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestInvalidRequests(t *testing.T) {
	tr := &Transport{Dial: func(context.Context, string, string) (net.Conn, error) {
		c1, c2 := net.Pipe()
		go io.Copy(io.Discard, c2)
		return c1, nil
	}}
	for _, f := range []func(*http.Request){
		func(r *http.Request) { r.Header["X"] = []string{"a\r\nInjected: 1"} },
		func(r *http.Request) { r.Header["Bad Name"] = []string{"v"} },
		func(r *http.Request) { r.Host = "a b" },
		func(r *http.Request) { r.Host = "h\r\nX: y" },
		func(r *http.Request) { r.Method = "GE T" },
		func(r *http.Request) { r.URL.RawQuery = "a b" },
	} {
		r, _ := http.NewRequest("GET", "http://127.0.0.1/x", nil)
		f(r)
		if _, err := tr.RoundTrip(r); err == nil {
			t.Errorf("accepted %+v", r)
		}
	}
}

// WroteHeaders fires before the request is written, so a caller can tell "never sent".
func TestTraceWroteHeaders(t *testing.T) {
	s := newRawServer(t, func(int) []byte { return []byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") })
	tr, _ := newTransport(t)
	var wrote atomic.Bool
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{WroteHeaders: func() { wrote.Store(true) }})
	req, _ := http.NewRequestWithContext(ctx, "POST", s.url()+"/", strings.NewReader("x"))
	if _, err := tr.RoundTrip(req); err != nil || !wrote.Load() {
		t.Fatalf("%v wrote=%v", err, wrote.Load())
	}
	wrote.Store(false)
	tr2 := &Transport{Dial: func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("refused") }}
	req, _ = http.NewRequestWithContext(ctx, "POST", s.url()+"/", strings.NewReader("x"))
	if _, err := tr2.RoundTrip(req); err == nil || wrote.Load() {
		t.Fatalf("dial failure: %v wrote=%v", err, wrote.Load())
	}
}

// Exchange with an Attempt: the deadline is the connection's, Cancel aborts, and a Cancel
// that comes after the exchange ended leaves the (pooled) connection alone.
func TestAttempt(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			select {
			case <-release:
			case <-r.Context().Done():
			}
		case "/slowbody":
			w.Header().Set("Content-Length", "10")
			w.Write([]byte("12345"))
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		default:
			io.WriteString(w, "ok")
		}
	}))
	defer s.Close()
	tr, d := newTransport(t)
	exchange := func(a *Attempt, path string) (string, error) {
		req, _ := http.NewRequest("GET", s.URL+path, nil)
		resp, err := tr.Exchange(req, a)
		if err != nil {
			return "", err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		return string(b), err
	}
	var a Attempt
	a.Reset(time.Now().Add(50 * time.Millisecond))
	if _, err := exchange(&a, "/slow"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
	a.Reset(time.Now().Add(50 * time.Millisecond))
	if _, err := exchange(&a, "/slowbody"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline in the body: %v", err)
	}
	// Cancel while the head is awaited.
	a.Reset(time.Now().Add(time.Minute))
	time.AfterFunc(30*time.Millisecond, a.Cancel)
	if _, err := exchange(&a, "/slow"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel: %v", err)
	}
	// A late Cancel does not touch the pooled connection the exchange gave back.
	dials := d.dials.Load()
	a.Reset(time.Now().Add(time.Minute))
	if got, err := exchange(&a, "/ok"); err != nil || got != "ok" {
		t.Fatalf("ok: %q %v", got, err)
	}
	a.Cancel()
	var b Attempt
	b.Reset(time.Now().Add(time.Minute))
	if got, err := exchange(&b, "/ok"); err != nil || got != "ok" {
		t.Fatalf("after a late cancel: %q %v", got, err)
	}
	if n := d.dials.Load() - dials; n != 1 {
		t.Fatalf("%d dials for two sequential exchanges, want 1", n)
	}
	if !b.Wrote() {
		t.Fatal("Wrote is false after an exchange")
	}
	// Close aborts an exchange in progress and refuses new ones.
	var c Attempt
	c.Reset(time.Now().Add(time.Minute))
	time.AfterFunc(30*time.Millisecond, tr.Close)
	if _, err := exchange(&c, "/slow"); !errors.Is(err, ErrClosed) {
		t.Fatalf("exchange during Close: %v", err)
	}
	c.Reset(time.Now().Add(time.Minute))
	if _, err := exchange(&c, "/ok"); !errors.Is(err, ErrClosed) {
		t.Fatalf("exchange after Close: %v", err)
	}
}

// TestImmediateAnswers: an upstream that answers the moment it has read a request. The
// transport waits for the response's bytes without a read first (writeAwait), and a
// response that arrives between the write and the wait must still wake it: a missed
// wake-up would end the exchange at its deadline instead.
func TestImmediateAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
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
					if _, err := http.ReadRequest(br); err != nil {
						return
					}
					if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")); err != nil {
						return
					}
				}
			}()
		}
	}()
	tr, d := newTransport(t)
	url := "http://" + ln.Addr().String() + "/x"
	for i := range 500 {
		var a Attempt
		a.Reset(time.Now().Add(10 * time.Second))
		req, _ := http.NewRequest("GET", url, nil)
		resp, err := tr.Exchange(req, &a)
		if err != nil {
			t.Fatalf("exchange %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "ok" {
			t.Fatalf("exchange %d: %q %v", i, b, err)
		}
		if _, ok := a.Upstream(); !ok {
			t.Fatalf("exchange %d: the sent and answered marks are missing", i)
		}
	}
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d dials for sequential exchanges, want 1", n)
	}
}

// TestHalfClosedIdle: the server ends its side of a kept-alive connection after a response
// (FIN) but keeps it open. A request on it after a while idle must not wait for its deadline
// (writeAwait's wait sees no new event for a FIN that came before it): it finds the end of
// file at once and is replayed on a new connection.
func TestHalfClosedIdle(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
				c.(*net.TCPConn).CloseWrite()
				io.Copy(io.Discard, br) // reads on, answers nothing more
				<-done
			}()
		}
	}()
	tr, d := newTransport(t)
	url := "http://" + ln.Addr().String() + "/x"
	for i := range 2 {
		var a Attempt
		a.Reset(time.Now().Add(30 * time.Second))
		req, _ := http.NewRequest("GET", url, nil)
		resp, err := tr.Exchange(req, &a)
		if err != nil {
			t.Fatalf("exchange %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "ok" {
			t.Fatalf("exchange %d: %q %v", i, b, err)
		}
		time.Sleep(maxAwaitIdle + 50*time.Millisecond) // idle past maxAwaitIdle; the FIN is here
	}
	if n := d.dials.Load(); n != 2 {
		t.Fatalf("%d dials, want 2 (the half-closed connection replaced)", n)
	}
}
