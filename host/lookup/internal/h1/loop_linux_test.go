package h1

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// FuzzLoopParser checks that the Loop's parser, fed a response in pieces as a socket would
// deliver it, reaches the same verdict as the blocking transport on the whole script
// (FuzzResponse's properties then carry over): the same error-ness, status, fields and body,
// and a reusable connection exactly when h1 pools it. Run it with
// go test -run XXX -fuzz FuzzLoopParser ./host/lookup/internal/h1/.
func FuzzLoopParser(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\nok\r\n0\r\nT: v\r\n\r\n",
		"HTTP/1.0 404 Not Found\r\n\r\nbody until EOF",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
		"HTTP/1.1 301 Moved\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n",
		"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffff\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokextra",
		"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n" + strings.Repeat("x", 2000),
	} {
		f.Add([]byte(s), false, uint8(7))
		f.Add([]byte(s), true, uint8(1))
	}
	const maxFields, maxBody = 16, 1 << 10
	f.Fuzz(func(t *testing.T, script []byte, head bool, step uint8) {
		method := "GET"
		if head {
			method = "HEAD"
		}
		// The blocking transport on the whole script.
		sc := &scriptConn{r: bytes.NewReader(script)}
		tr := &Transport{
			Dial:                   func(context.Context, string, string) (net.Conn, error) { return sc, nil },
			MaxResponseHeaderBytes: 2 << 10, MaxHeaderCount: maxFields, MaxBodyBytes: maxBody,
		}
		req, _ := http.NewRequest(method, "http://127.0.0.1/x", nil)
		want, werr := tr.RoundTrip(req)
		var wbody []byte
		if werr == nil {
			wbody, werr = io.ReadAll(want.Body)
			want.Body.Close()
		}
		tr.pool.mu.Lock()
		pooled := len(tr.pool.idle["127.0.0.1:80"]) > 0
		tr.pool.mu.Unlock()

		// The loop's parser on growing prefixes, then on the whole script with EOF.
		lt := &Transport{MaxResponseHeaderBytes: 2 << 10, MaxHeaderCount: maxFields, MaxBodyBytes: maxBody}
		lt.init()
		p := parser{t: lt}
		req2, _ := http.NewRequest(method, "http://127.0.0.1/x", nil)
		// As Loop.read does: the framer says when to parse.
		var got parsed
		var gerr error = errMore
		var fr framer
		n := 0
		for n < len(script) {
			n = min(n+1+int(step), len(script))
			if !fr.ready(script[:n], lt.MaxResponseHeaderBytes) {
				continue
			}
			if got, gerr = p.parse(script[:n], false, req2); !errors.Is(gerr, errMore) {
				break
			}
			fr.more(n, got)
		}
		if errors.Is(gerr, errMore) {
			got, gerr = p.parse(script, true, req2)
		}
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("h1: %v; loop: %v", werr, gerr)
		}
		if werr != nil {
			return
		}
		gbody, _ := io.ReadAll(got.resp.Body)
		if got.resp.StatusCode != want.StatusCode || !bytes.Equal(gbody, wbody) ||
			got.resp.ContentLength != want.ContentLength || got.resp.Close != want.Close {
			t.Fatalf("h1: %d %q cl=%d close=%v; loop: %d %q cl=%d close=%v", want.StatusCode, wbody, want.ContentLength,
				want.Close, got.resp.StatusCode, gbody, got.resp.ContentLength, got.resp.Close)
		}
		if !reflect.DeepEqual(got.resp.Header, want.Header) {
			t.Fatalf("fields: h1 %q; loop %q", want.Header, got.resp.Header)
		}
		// Bytes after the response arrive, on the loop, on the idle connection, which is then
		// closed: compare reuse only when the response ended with the script.
		if n == len(script) && got.reusable != pooled {
			t.Fatalf("reusable: h1 %v, loop %v", pooled, got.reusable)
		}
	})
}

func newLoop(t *testing.T, dials *atomic.Int32) *Loop {
	l := &Loop{
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials != nil {
				dials.Add(1)
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		MaxBodyBytes: 1 << 20,
	}
	t.Cleanup(l.Close)
	return l
}

type result struct {
	resp *http.Response
	body string
	err  error
}

// exchange runs one exchange on l and waits for it.
func exchange(t *testing.T, l *Loop, req *http.Request, a *Attempt) result {
	t.Helper()
	ch := make(chan result, 1)
	l.Start(req, a, func(resp *http.Response, err error) {
		r := result{resp: resp, err: err}
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			r.body = string(b)
		}
		ch <- r
	})
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no completion")
		return result{}
	}
}

func TestLoopExchanges(t *testing.T) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/chunked":
			w.Write([]byte("part1,"))
			w.(http.Flusher).Flush()
			w.Write([]byte("part2"))
		case "/big":
			w.Write(bytes.Repeat([]byte("y"), 300<<10))
		case "/huge":
			w.Write(bytes.Repeat([]byte("z"), 2<<20))
		case "/slow":
			time.Sleep(300 * time.Millisecond)
		default:
			fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, body)
		}
	}))
	defer s.Close()
	var dials atomic.Int32
	l := newLoop(t, &dials)
	var a Attempt
	do := func(method, path, body string, deadline time.Duration) result {
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, _ := http.NewRequest(method, s.URL+path, rd)
		a.Reset(time.Now().Add(deadline))
		return exchange(t, l, req, &a)
	}
	for i := range 3 {
		if r := do("GET", "/a", "", time.Second); r.err != nil || r.body != "GET /a " {
			t.Fatalf("GET %d: %+v", i, r)
		}
	}
	if r := do("POST", "/p", "hello", time.Second); r.err != nil || r.body != "POST /p hello" {
		t.Fatalf("POST: %+v", r)
	}
	if r := do("HEAD", "/h", "", time.Second); r.err != nil || r.resp.StatusCode != 200 || r.body != "" {
		t.Fatalf("HEAD: %+v", r)
	}
	if r := do("GET", "/chunked", "", time.Second); r.err != nil || r.body != "part1,part2" {
		t.Fatalf("chunked: %+v", r)
	}
	if r := do("GET", "/big", "", time.Second); r.err != nil || len(r.body) != 300<<10 {
		t.Fatalf("big: %v %d", r.err, len(r.body))
	}
	if d := dials.Load(); d != 1 {
		t.Fatalf("%d dials for sequential exchanges: want one kept-alive connection", d)
	}
	if r := do("GET", "/huge", "", time.Second); !errors.Is(r.err, ErrBodyTooLarge) {
		t.Fatalf("huge: %v", r.err)
	}
	if r := do("GET", "/slow", "", 50*time.Millisecond); !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", r.err)
	}
	// Cancel while the server sleeps.
	req, _ := http.NewRequest("GET", s.URL+"/slow", nil)
	a.Reset(time.Now().Add(5 * time.Second))
	ch := make(chan error, 1)
	l.Start(req, &a, func(_ *http.Response, err error) { ch <- err })
	time.Sleep(20 * time.Millisecond)
	a.Cancel()
	select {
	case err := <-ch:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancel: %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("cancel did not end the exchange")
	}
	// A server that closes idle connections: an idempotent request is replayed on a new
	// connection, transparently.
	s.CloseClientConnections()
	time.Sleep(20 * time.Millisecond)
	if r := do("GET", "/after", "", time.Second); r.err != nil || r.body != "GET /after " {
		t.Fatalf("after the server closed idle connections: %+v", r)
	}
}

func TestLoopClose(t *testing.T) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Second)
	}))
	defer s.Close()
	l := newLoop(t, nil)
	const n = 8
	atts := make([]Attempt, n)
	ch := make(chan error, n)
	for i := range atts {
		req, _ := http.NewRequest("GET", s.URL, nil)
		atts[i].Reset(time.Now().Add(10 * time.Second))
		l.Start(req, &atts[i], func(_ *http.Response, err error) { ch <- err })
	}
	time.Sleep(50 * time.Millisecond)
	l.Close()
	for range n {
		if err := <-ch; !errors.Is(err, ErrClosed) {
			t.Fatalf("after Close: %v", err)
		}
	}
	req, _ := http.NewRequest("GET", s.URL, nil)
	var a Attempt
	l.Start(req, &a, func(_ *http.Response, err error) { ch <- err })
	if err := <-ch; !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close: %v", err)
	}
}

// A dial that fails is reported as it is (the egress guard's refusal must stay visible).
func TestLoopDialError(t *testing.T) {
	refused := errors.New("refused by policy")
	l := &Loop{Dial: func(context.Context, string, string) (net.Conn, error) { return nil, refused }}
	defer l.Close()
	req, _ := http.NewRequest("GET", "http://10.0.0.1/x", nil)
	var a Attempt
	if r := exchange(t, l, req, &a); !errors.Is(r.err, refused) {
		t.Fatalf("got %v", r.err)
	}
}
