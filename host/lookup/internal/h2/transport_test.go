package h2

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/attempt"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2cServer is net/http's server speaking HTTP/2 with prior knowledge on 127.0.0.1. conns
// counts the connections it accepted.
func h2cServer(t *testing.T, h http.Handler, cfg *http.HTTP2Config) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	s := httptest.NewUnstartedServer(h)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	s.Config.Protocols = &p
	s.Config.HTTP2 = cfg
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s, &conns
}

// loopbackDial dials only 127.0.0.1; anything else fails the test.
func loopbackDial(t *testing.T) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if host, _, _ := net.SplitHostPort(addr); host != "127.0.0.1" {
			t.Errorf("dial to %s: only 127.0.0.1 is allowed in tests", addr)
			return nil, errors.New("refused by test")
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

func newTransport(t *testing.T) *Transport {
	tr := &Transport{Dial: loopbackDial(t), MaxBodyBytes: 8 << 20}
	t.Cleanup(tr.Close)
	return tr
}

type result struct {
	resp *http.Response
	body []byte
	err  error
}

// do runs one exchange and waits for it.
func do(tr *Transport, req *http.Request, deadline time.Duration) result {
	var a attempt.Attempt
	if deadline > 0 {
		a.Reset(time.Now().Add(deadline))
	}
	return doAttempt(tr, req, &a)
}

func doAttempt(tr *Transport, req *http.Request, a *attempt.Attempt) result {
	ch := make(chan result, 1)
	tr.Start(req, a, func(resp *http.Response, err error) {
		var r result
		r.resp, r.err = resp, err
		if err == nil {
			r.body, r.err = io.ReadAll(resp.Body)
		}
		ch <- r
	})
	return <-ch
}

func get(t *testing.T, base, path string) *http.Request {
	req, err := http.NewRequest("GET", base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestExchange(t *testing.T) {
	srv, _ := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 {
			t.Errorf("server saw %s", r.Proto)
		}
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Method", r.Method)
		w.Header().Set("X-Auth", r.Header.Get("Authorization"))
		w.Header().Set("X-Query", r.URL.RawQuery)
		w.Header().Set("X-Host", r.Host)
		w.WriteHeader(201)
		w.Write(append([]byte("echo:"), b...))
	}), nil)
	tr := newTransport(t)
	req, _ := http.NewRequest("POST", srv.URL+"/a/b?q=1&r=%20", strings.NewReader("hello"))
	req.Header.Set("Authorization", "Bearer s3cret")
	req.Header.Set("Connection", "keep-alive") // connection-specific: dropped
	r := do(tr, req, 5*time.Second)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.resp.StatusCode != 201 || string(r.body) != "echo:hello" || r.resp.ProtoMajor != 2 {
		t.Fatalf("got %d %q %s", r.resp.StatusCode, r.body, r.resp.Proto)
	}
	h := r.resp.Header
	if h.Get("X-Method") != "POST" || h.Get("X-Auth") != "Bearer s3cret" || h.Get("X-Query") != "q=1&r=%20" || h.Get("X-Host") != strings.TrimPrefix(srv.URL, "http://") {
		t.Fatalf("headers: %v", h)
	}
	if r.resp.ContentLength != int64(len("echo:hello")) {
		t.Fatalf("content length %d", r.resp.ContentLength)
	}
}

// TestMultiplexing: 1024 exchanges, 256 at a time, share 256/MaxStreamsPerConn connections.
func TestMultiplexing(t *testing.T) {
	srv, conns := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Millisecond)
		io.WriteString(w, r.URL.Path)
	}), &http.HTTP2Config{MaxConcurrentStreams: 300})
	tr := newTransport(t)
	const total, inflight = 1024, 256
	var wg sync.WaitGroup
	sem := make(chan struct{}, inflight)
	var bad atomic.Int64
	for i := range total {
		sem <- struct{}{}
		wg.Add(1)
		path := "/k/" + strconv.Itoa(i)
		var a attempt.Attempt
		a.Reset(time.Now().Add(10 * time.Second))
		tr.Start(get(t, srv.URL, path), &a, func(resp *http.Response, err error) {
			defer wg.Done()
			defer func() { <-sem }()
			if err != nil || resp.StatusCode != 200 {
				bad.Add(1)
				return
			}
			if b, _ := io.ReadAll(resp.Body); string(b) != path {
				bad.Add(1)
			}
		})
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d exchanges failed", bad.Load())
	}
	if n, want := conns.Load(), int64(inflight/DefaultMaxStreamsPerConn); n != want {
		t.Fatalf("%d connections for %d streams in flight, want %d (%d streams per connection)", n, inflight, want, DefaultMaxStreamsPerConn)
	}
}

// TestMaxConcurrentStreams: a server that allows 2 streams per connection still serves 40
// concurrent exchanges (queued on a connection, or on more connections).
func TestMaxConcurrentStreams(t *testing.T) {
	var cur, peak atomic.Int64
	srv, _ := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := cur.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(2 * time.Millisecond)
		cur.Add(-1)
		io.WriteString(w, "ok")
	}), &http.HTTP2Config{MaxConcurrentStreams: 2})
	tr := newTransport(t)
	var wg sync.WaitGroup
	var bad atomic.Int64
	for range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := do(tr, get(t, srv.URL, "/"), 10*time.Second); r.err != nil || string(r.body) != "ok" {
				t.Errorf("exchange: %v %q", r.err, r.body)
				bad.Add(1)
			}
		}()
	}
	wg.Wait()
	if bad.Load() > 0 {
		t.Fatal("exchanges failed")
	}
}

// TestFlowControl: a 3 MiB response (beyond the 1 MiB stream window: WINDOW_UPDATEs from
// the client) and a 300 KiB request body (beyond the server's 64 KiB initial window: the
// client waits for the server's WINDOW_UPDATEs).
func TestFlowControl(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB
	srv, _ := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" {
			b, _ := io.ReadAll(r.Body)
			io.WriteString(w, strconv.Itoa(len(b)))
			return
		}
		w.Write(big)
	}), &http.HTTP2Config{MaxReceiveBufferPerStream: 65535, MaxReceiveBufferPerConnection: 65535})
	tr := newTransport(t)
	r := do(tr, get(t, srv.URL, "/big"), 10*time.Second)
	if r.err != nil || !bytes.Equal(r.body, big) {
		t.Fatalf("big response: %v, %d bytes", r.err, len(r.body))
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := bytes.Repeat([]byte("x"), 300<<10)
			req, _ := http.NewRequest("POST", srv.URL+"/up", bytes.NewReader(body))
			r := do(tr, req, 10*time.Second)
			if r.err != nil || string(r.body) != strconv.Itoa(len(body)) {
				t.Errorf("big request: %v %q", r.err, r.body)
			}
		}()
	}
	wg.Wait()
}

func TestBodyTooLarge(t *testing.T) {
	srv, _ := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/cl" {
			w.Header().Set("Content-Length", "5000")
			w.Write(make([]byte, 5000))
			return
		}
		for range 5 { // no content-length: the limit is hit while reading
			w.Write(make([]byte, 1000))
			w.(http.Flusher).Flush()
		}
	}), nil)
	tr := &Transport{Dial: loopbackDial(t), MaxBodyBytes: 4096}
	defer tr.Close()
	for _, p := range []string{"/cl", "/stream"} {
		if r := do(tr, get(t, srv.URL, p), 5*time.Second); !errors.Is(r.err, attempt.ErrBodyTooLarge) {
			t.Fatalf("%s: got %v, want ErrBodyTooLarge", p, r.err)
		}
	}
	// The connection survives a reset stream.
	srv2, conns := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "small") }), nil)
	if r := do(tr, get(t, srv2.URL, "/"), 5*time.Second); r.err != nil || string(r.body) != "small" {
		t.Fatal(r.err)
	}
	_ = conns
}

// TestDeadlineAndCancel: a slow exchange fails at its deadline with DeadlineExceeded, a
// cancelled one with Canceled; the connection stays in use for the next exchanges.
func TestDeadlineAndCancel(t *testing.T) {
	release := make(chan struct{})
	srv, conns := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "ok")
	}), nil)
	defer close(release)
	tr := newTransport(t)
	if r := do(tr, get(t, srv.URL, "/"), 5*time.Second); r.err != nil {
		t.Fatal(r.err)
	}
	r := do(tr, get(t, srv.URL, "/slow"), 50*time.Millisecond)
	if !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", r.err)
	}
	var a attempt.Attempt
	a.Reset(time.Now().Add(5 * time.Second))
	go func() { time.Sleep(20 * time.Millisecond); a.Cancel() }()
	if r := doAttempt(tr, get(t, srv.URL, "/slow"), &a); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("got %v, want Canceled", r.err)
	}
	// Cancelled before Start: fails at once.
	var b attempt.Attempt
	b.Cancel()
	if r := doAttempt(tr, get(t, srv.URL, "/"), &b); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("got %v, want Canceled", r.err)
	}
	if r := do(tr, get(t, srv.URL, "/"), 5*time.Second); r.err != nil || string(r.body) != "ok" {
		t.Fatal(r.err)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections: a reset stream must not close its connection", n)
	}
}

// TestStreamReset: a handler that aborts makes the server reset the stream.
func TestStreamReset(t *testing.T) {
	srv, _ := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("partial"))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}), nil)
	srv.Config.ErrorLog = nil
	tr := newTransport(t)
	r := do(tr, get(t, srv.URL, "/"), 5*time.Second)
	var se *StreamError
	if !errors.As(r.err, &se) {
		t.Fatalf("got %v, want a StreamError", r.err)
	}
}

func TestNotHTTP2(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})) // HTTP/1.1 only
	defer srv.Close()
	tr := newTransport(t)
	r := do(tr, get(t, srv.URL, "/"), 5*time.Second)
	if r.err == nil {
		t.Fatal("an HTTP/1.1 server answered an h2c exchange")
	}
	// A closed port: the dial fails.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	if r := do(tr, get(t, "http://"+addr, "/"), 5*time.Second); r.err == nil {
		t.Fatal("exchange with a closed port succeeded")
	}
}

func TestHeaderListTooLarge(t *testing.T) {
	srv, _ := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Big", strings.Repeat("a", 8000))
		io.WriteString(w, "x")
	}), nil)
	tr := &Transport{Dial: loopbackDial(t), MaxResponseHeaderBytes: 4096}
	defer tr.Close()
	if r := do(tr, get(t, srv.URL, "/"), 5*time.Second); r.err == nil {
		t.Fatal("oversized header list accepted")
	}
}

func TestClose(t *testing.T) {
	block := make(chan struct{})
	srv, _ := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}), nil)
	defer close(block)
	tr := &Transport{Dial: loopbackDial(t)}
	ch := make(chan error, 3)
	for range 3 {
		var a attempt.Attempt
		tr.Start(get(t, srv.URL, "/"), &a, func(_ *http.Response, err error) { ch <- err })
	}
	time.Sleep(50 * time.Millisecond)
	tr.Close()
	for range 3 {
		if err := <-ch; !errors.Is(err, ErrClosed) {
			t.Fatalf("got %v, want ErrClosed", err)
		}
	}
	var a attempt.Attempt
	tr.Start(get(t, srv.URL, "/"), &a, func(_ *http.Response, err error) { ch <- err })
	if err := <-ch; !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close: %v", err)
	}
}

// TestGoAway, against a scripted server: GOAWAY with last stream id 1 while streams 1, 3
// and 5 are open. Stream 1 completes; 3 and 5 fail with ErrRefused (not processed); a new
// exchange goes over a new connection.
func TestGoAway(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int64
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			n := accepted.Add(1)
			go scriptedServer(nc, n == 1)
		}
	}()
	tr := newTransport(t)
	base := "http://" + ln.Addr().String()
	ch := make(chan result, 3)
	for i := range 3 {
		var a attempt.Attempt
		a.Reset(time.Now().Add(5 * time.Second))
		tr.Start(get(t, base, "/"+strconv.Itoa(i)), &a, func(resp *http.Response, err error) {
			r := result{resp: resp, err: err}
			if err == nil {
				r.body, _ = io.ReadAll(resp.Body)
			}
			ch <- r
		})
	}
	var ok, refused int
	for range 3 {
		r := <-ch
		switch {
		case r.err == nil && string(r.body) == "1":
			ok++
		case errors.Is(r.err, ErrRefused):
			refused++
		default:
			t.Errorf("unexpected result %v %q", r.err, r.body)
		}
	}
	if ok != 1 || refused != 2 {
		t.Fatalf("ok %d refused %d, want 1 and 2", ok, refused)
	}
	if r := do(tr, get(t, base, "/again"), 5*time.Second); r.err != nil || string(r.body) != "1" {
		t.Fatalf("after GOAWAY: %v %q", r.err, r.body)
	}
	if accepted.Load() != 2 {
		t.Fatalf("%d connections, want 2", accepted.Load())
	}
}

// scriptedServer speaks just enough HTTP/2: with goAway, it waits for streams 1, 3 and 5,
// then sends GOAWAY(last=1) and answers stream 1; otherwise it answers every stream.
func scriptedServer(nc net.Conn, goAway bool) {
	defer nc.Close()
	br := bufio.NewReader(nc)
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(br, preface); err != nil {
		return
	}
	var mu sync.Mutex
	var out bytes.Buffer
	fr := http2.NewFramer(&out, br)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	flush := func() { nc.Write(out.Bytes()); out.Reset() }
	enc := hpack.NewEncoder(&bytes.Buffer{})
	var hb bytes.Buffer
	enc = hpack.NewEncoder(&hb)
	answer := func(id uint32) {
		hb.Reset()
		enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
		fr.WriteData(id, true, []byte("1"))
	}
	mu.Lock()
	fr.WriteSettings()
	flush()
	mu.Unlock()
	var open []uint32
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		mu.Lock()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if !goAway {
				answer(f.StreamID)
				break
			}
			open = append(open, f.StreamID)
			if len(open) == 3 {
				fr.WriteGoAway(1, http2.ErrCodeNo, nil)
				answer(1)
			}
		}
		flush()
		mu.Unlock()
	}
}

// TestURLForms: the request URI carries an escaped path and the query; the default port
// is 80 (not dialled here: only the address is computed).
func TestURLForms(t *testing.T) {
	u, _ := url.Parse("http://example.test/a%2Fb?x=1")
	if got := dialAddr(u); got != "example.test:80" {
		t.Fatal(got)
	}
	if got := u.RequestURI(); got != "/a%2Fb?x=1" {
		t.Fatal(got)
	}
}

// chanListener hands net.Pipe ends to a server: connections without a file descriptor, so
// every write goes through the writer goroutine.
type chanListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *chanListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *chanListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 80} }

func TestConnWithoutDescriptor(t *testing.T) {
	l := &chanListener{ch: make(chan net.Conn), done: make(chan struct{})}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, r.URL.Path+":"+strconv.Itoa(len(b)))
	})}
	go srv.Serve(l)
	defer srv.Close()
	tr := &Transport{Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		c, s := net.Pipe()
		select {
		case l.ch <- s:
			return c, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}}
	defer tr.Close()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := bytes.Repeat([]byte("b"), i*1000)
			req, _ := http.NewRequest("POST", "http://127.0.0.1/p"+strconv.Itoa(i), bytes.NewReader(body))
			r := do(tr, req, 5*time.Second)
			if want := "/p" + strconv.Itoa(i) + ":" + strconv.Itoa(len(body)); r.err != nil || string(r.body) != want {
				t.Errorf("got %v %q, want %q", r.err, r.body, want)
			}
		}()
	}
	wg.Wait()
}

// TestFullSocketBuffer: a server that grants a huge window and then does not read for a
// while. The client's non-blocking writes find the socket buffer full and hand the rest to
// the writer goroutine; nothing is lost or reordered, and Start never blocks meanwhile.
func TestFullSocketBuffer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const n, size = 16, 512 << 10 // 8 MiB of request bodies
	started := make(chan struct{})
	var blocked atomic.Bool
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		br := bufio.NewReaderSize(nc, 64<<10)
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(br, preface); err != nil {
			return
		}
		var out bytes.Buffer
		fr := http2.NewFramer(&out, br)
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1})
		fr.WriteWindowUpdate(0, 1<<31-1-65535)
		nc.Write(out.Bytes())
		out.Reset()
		// Not a byte is read until every Start has returned: the client's writes pile up
		// meanwhile, so a Start that waited for the socket would never return.
		select {
		case <-started:
		case <-time.After(10 * time.Second): // a hang detector, not a speed check
			blocked.Store(true)
		}
		got := map[uint32]int{}
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		for done := 0; done < n; {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					fr.WriteSettingsAck()
				}
			case *http2.DataFrame:
				got[f.StreamID] += len(f.Data())
				if f.StreamEnded() {
					hb.Reset()
					enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
					fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: hb.Bytes(), EndHeaders: true})
					fr.WriteData(f.StreamID, true, []byte(strconv.Itoa(got[f.StreamID])))
					done++
				}
			}
			if out.Len() > 0 {
				nc.Write(out.Bytes())
				out.Reset()
			}
		}
		io.Copy(io.Discard, br)
	}()
	tr := newTransport(t)
	base := "http://" + ln.Addr().String()
	ch := make(chan result, n)
	for range n {
		var a attempt.Attempt
		a.Reset(time.Now().Add(10 * time.Second))
		req, _ := http.NewRequest("POST", base+"/", bytes.NewReader(bytes.Repeat([]byte("z"), size)))
		tr.Start(req, &a, func(resp *http.Response, err error) {
			r := result{resp: resp, err: err}
			if err == nil {
				r.body, _ = io.ReadAll(resp.Body)
			}
			ch <- r
		})
	}
	close(started)
	for range n {
		r := <-ch
		if r.err != nil || string(r.body) != strconv.Itoa(size) {
			t.Fatalf("got %v %q, want %d bytes received", r.err, r.body, size)
		}
	}
	if blocked.Load() {
		t.Fatal("Start blocked while the server was not reading")
	}
}

// TestIdleConnTimeout waits for the idle connection's Close (a signal), not for a period.
func TestIdleConnTimeout(t *testing.T) {
	srv, conns := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), nil)
	closed := make(chan struct{}, 4)
	dial := loopbackDial(t)
	tr := &Transport{IdleConnTimeout: 250 * time.Millisecond, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &closeSignalConn{Conn: c, closed: closed}, nil
	}}
	defer tr.Close()
	for range 2 {
		if r := do(tr, get(t, srv.URL, "/"), 5*time.Second); r.err != nil {
			t.Fatal(r.err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second): // a hang detector, not a speed check
		t.Fatal("the idle connection was never closed")
	}
	if r := do(tr, get(t, srv.URL, "/"), 5*time.Second); r.err != nil {
		t.Fatal(r.err)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections after an idle period, want 2 (the idle one closed)", n)
	}
}

// closeSignalConn reports its first Close on closed.
type closeSignalConn struct {
	net.Conn
	once   sync.Once
	closed chan<- struct{}
}

func (c *closeSignalConn) Close() error {
	c.once.Do(func() { c.closed <- struct{}{} })
	return c.Conn.Close()
}
