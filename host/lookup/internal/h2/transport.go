// Package h2 is a lean HTTP/2 client over cleartext TCP with prior knowledge (h2c, RFC 9113
// §3.3), for host/lookup: many concurrent short exchanges with one upstream.
//
// Multiplexing is the point. With HTTP/1.1 each exchange in flight holds a connection, and
// each request and each response is a TCP segment and a system call on both sides: at 256 in
// flight on two vCPUs the kernel's loopback TCP work alone takes most of the CPU (see
// host/lookup/DESIGN.md). Here the exchanges of an endpoint share a few connections; the
// frames of every request queued while a write is in progress go out in the next single
// write, and one read brings many responses. Per exchange the system calls drop from about
// four to a small fraction of one.
//
// # Design
//
// A connection has a reader goroutine, which owns the read side of the [http2.Framer] and
// the HPACK decoder, and a writer goroutine for writes that would block. Everything else
// (stream table, flow-control windows, the HPACK encoder, the outgoing buffer) is guarded by
// the connection's mutex. [Transport.Start] appends frames under it, and whoever releases
// it next writes all that is queued with one non-blocking system call (the reader only
// after the batch of frames it has buffered, see conn.unlock); what the socket does not take
// goes to the writer goroutine. So Start never blocks on the network. Completions are
// called from the reader goroutine (or a timer's, or a new goroutine's for early failures
// and cancellation), never with a lock held and never before Start returns. Streams go on
// the first connection with room (MaxStreamsPerConn, and the server's limit).
//
// A request is sent from memory: HEADERS (and CONTINUATION) and its body in DATA frames as
// the peer's flow-control windows allow; the rest of a body waits for WINDOW_UPDATE. A
// response is read whole, its body bounded by MaxBodyBytes. A connection advertises large
// receive windows and tops them up as data is consumed, so a response never waits on the
// client. SETTINGS_MAX_CONCURRENT_STREAMS is respected: a connection that is full queues new
// streams until one ends, and the transport opens another connection instead when it can.
// GOAWAY stops new streams on a connection; streams above its last stream id fail with
// [ErrRefused] (not processed by the server). RST_STREAM fails its stream; REFUSED_STREAM as
// ErrRefused. Deadlines and [attempt.Attempt.Cancel] reset the stream (RST_STREAM CANCEL) and
// leave the connection in use.
//
// Not implemented: TLS (https endpoints use net/http, which negotiates h2 by ALPN), server
// push (disabled in SETTINGS; a PUSH_PROMISE is a connection error), request trailers,
// priorities, and the Upgrade handshake from HTTP/1.1.
package h2

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/attempt"
	"golang.org/x/net/http2"
)

// Transport is an HTTP/2 cleartext client; see the package documentation. Set its fields
// before the first request; its methods are safe for concurrent use.
type Transport struct {
	// Dial opens a connection to "host:port". Required. host/lookup passes the endpoint's
	// guarded dialer, which runs the egress checks first.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Context bounds dials; the transport does not watch it otherwise (Close does that).
	Context context.Context
	// MaxResponseHeaderBytes bounds a response's header list (advertised as
	// SETTINGS_MAX_HEADER_LIST_SIZE). Default 64 KiB.
	MaxResponseHeaderBytes int
	// MaxBodyBytes, if positive, bounds a response body: more fails the exchange with
	// attempt.ErrBodyTooLarge (at once when content-length says so) and resets the stream.
	MaxBodyBytes int64
	// IdleConnTimeout closes a connection without streams for this long. Default 90s.
	IdleConnTimeout time.Duration
	// MaxStreamsPerConn caps the streams of one connection below the server's
	// SETTINGS_MAX_CONCURRENT_STREAMS. Each connection's responses are read, and their
	// completions run, on one goroutine: a few connections spread that work over the CPUs
	// and keep a burst of completions from queueing behind each other. Default 64.
	MaxStreamsPerConn int
	// Sensitive names request header fields (canonical form) that HPACK must never index,
	// such as credentials: they are sent as never-indexed literals (RFC 7541 §7.1.3).
	// Authorization, Proxy-Authorization and Cookie always are.
	Sensitive map[string]bool
	// HeadersFor, if set, says for which response statuses the caller reads the header
	// fields: for the others the response's Header is nil (the fields are still checked, and
	// content-length still read), which saves building a map per response.
	HeadersFor func(status int) bool

	once sync.Once
	mu   sync.Mutex
	// guarded by mu
	conns  map[string][]*conn // by dial address
	closed bool
	wg     sync.WaitGroup // the goroutines of every connection

	addrs atomic.Pointer[[2]string] // the last URL host and its dial address
}

// Defaults and protocol constants.
const (
	DefaultMaxResponseHeaderBytes = 64 << 10
	DefaultIdleConnTimeout        = 90 * time.Second
	DefaultMaxStreamsPerConn      = 32

	// The receive windows the client advertises: a stream's is large enough for most
	// responses to arrive without a WINDOW_UPDATE, the connection's for many at once.
	streamWindow = 1 << 20
	connWindow   = 16 << 20
	// A window is topped up once half of it has been consumed.

	readBufSize  = 64 << 10
	maxKeptWrite = 256 << 10
	maxFrameRead = 1 << 20 // SETTINGS_MAX_FRAME_SIZE we accept
	batchFlush   = 16      // the reader writes mid-batch once this many streams wait to be sent
)

// Errors.
var (
	// ErrRefused: the server did not process the request (REFUSED_STREAM, or a stream above
	// a GOAWAY's last stream id). It is safe to retry, whatever the method.
	ErrRefused = errors.New("h2: stream refused by the server (not processed)")
	// ErrClosed: the transport was closed.
	ErrClosed = errors.New("h2: transport closed")
	// ErrUnsupported: the request needs what this transport does not implement.
	ErrUnsupported = errors.New("h2: request not supported by the HTTP/2 fast path")
	errTimeout     = errors.New("h2: exchange exceeded its deadline")
)

// StreamError is a stream reset by the server with an error code other than
// REFUSED_STREAM, or a response this client rejects.
type StreamError struct {
	Code   http2.ErrCode
	Reason string
}

func (e *StreamError) Error() string {
	if e.Reason != "" {
		return "h2: stream error: " + e.Reason
	}
	return "h2: stream reset by server: " + e.Code.String()
}

// connError wraps a connection-level failure.
type connError struct {
	op  string
	err error
}

func (e *connError) Error() string { return "h2: " + e.op + ": " + e.err.Error() }

func (e *connError) Unwrap() error { return e.err }

func (t *Transport) init() {
	t.once.Do(func() {
		if t.MaxResponseHeaderBytes <= 0 {
			t.MaxResponseHeaderBytes = DefaultMaxResponseHeaderBytes
		}
		if t.IdleConnTimeout <= 0 {
			t.IdleConnTimeout = DefaultIdleConnTimeout
		}
		if t.Context == nil {
			t.Context = context.Background()
		}
		if t.MaxStreamsPerConn <= 0 {
			t.MaxStreamsPerConn = DefaultMaxStreamsPerConn
		}
		t.conns = make(map[string][]*conn)
	})
}

// Handles reports whether Start serves req: http:// with a host, a body of known length
// (or none), no Expect, Upgrade or trailers, not CONNECT.
func (t *Transport) Handles(req *http.Request) bool {
	u := req.URL
	if u == nil || u.Scheme != "http" || u.Host == "" || req.Method == http.MethodConnect {
		return false
	}
	if req.Body != nil && req.Body != http.NoBody && req.ContentLength <= 0 {
		return false
	}
	if len(req.TransferEncoding) > 0 || len(req.Trailer) > 0 {
		return false
	}
	for k := range req.Header {
		switch k {
		case "Expect", "Upgrade", "Trailer":
			return false
		}
	}
	return true
}

// Start sends req and calls done with the response (its body read in full, at most
// MaxBodyBytes) or an error. done runs on a connection's reader goroutine, a timer's
// goroutine, or a new goroutine, never before Start returns, and must not block. a carries
// the deadline and cancellation and records Wrote; it must not be reused before done.
func (t *Transport) Start(req *http.Request, a *attempt.Attempt, done func(*http.Response, error)) {
	t.init()
	fail := func(err error) { go done(nil, err) }
	if !t.Handles(req) {
		closeBody(req)
		fail(ErrUnsupported)
		return
	}
	st := &stream{req: req, a: a, done: done, deadline: a.Deadline, hidx: -1}
	if req.Body != nil && req.Body != http.NoBody {
		b := make([]byte, req.ContentLength)
		_, err := io.ReadFull(req.Body, b)
		if err == nil {
			var one [1]byte
			if n, _ := req.Body.Read(one[:]); n > 0 {
				err = errors.New("h2: request body longer than ContentLength")
			}
		}
		req.Body.Close()
		if err != nil {
			fail(fmt.Errorf("h2: reading request body: %w", err))
			return
		}
		st.body = b
	}
	if !a.Bind(st) {
		fail(&connError{op: "write request", err: context.Canceled})
		return
	}
	addr := t.dialAddr(req.URL)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		a.Unbind()
		fail(&connError{op: "write request", err: ErrClosed})
		return
	}
	c := t.pickLocked(addr)
	c.mu.Lock() // before t.mu is released: the connection cannot be retired in between
	t.mu.Unlock()
	st.c.Store(c)
	c.addLocked(st)
	c.unlock()
}

// pickLocked returns a connection to addr with room for one more stream, opening one if
// none has room. t.mu is held.
func (t *Transport) pickLocked(addr string) *conn {
	cs := t.conns[addr]
	// The first with room: filling few connections batches more frames per write.
	for _, c := range cs {
		c.mu.Lock()
		// Until its SETTINGS arrive the server's limit is unknown: the handshake sheds
		// what exceeds it to other connections.
		ok := c.err == nil && !c.goingAway && c.load < c.maxStreams
		c.mu.Unlock()
		if ok {
			return c
		}
	}
	c := t.newConnLocked(addr)
	t.conns[addr] = append(cs, c)
	return c
}

// retire removes c from the pool (it failed or is going away).
func (t *Transport) retire(c *conn) {
	t.mu.Lock()
	cs := t.conns[c.addr]
	for i, x := range cs {
		if x == c {
			t.conns[c.addr] = append(cs[:i:i], cs[i+1:]...)
			break
		}
	}
	t.mu.Unlock()
}

// Close fails every exchange with ErrClosed, closes the connections and waits for their
// goroutines. Start after Close fails with ErrClosed.
// Blocking reports false: Start never waits for the exchange, and done runs on a
// connection's reader goroutine.
func (t *Transport) Blocking() bool { return false }

func (t *Transport) Close() {
	t.init()
	t.mu.Lock()
	t.closed = true
	var all []*conn
	for _, cs := range t.conns {
		all = append(all, cs...)
	}
	t.conns = map[string][]*conn{}
	t.mu.Unlock()
	for _, c := range all {
		c.fail(&connError{op: "exchange", err: ErrClosed})
	}
	t.wg.Wait()
}

// dialAddr is u's "host:port" (port 80 by default), remembered for the last host.
func (t *Transport) dialAddr(u *url.URL) string {
	if e := t.addrs.Load(); e != nil && e[0] == u.Host {
		return e[1]
	}
	a := dialAddr(u)
	t.addrs.Store(&[2]string{u.Host, a})
	return a
}

func dialAddr(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// requeue places a stream that was never sent on another connection.
func (t *Transport) requeue(st *stream) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		go st.finish(nil, &connError{op: "write request", err: ErrClosed})
		return
	}
	c := t.pickLocked(t.dialAddr(st.req.URL))
	c.mu.Lock()
	t.mu.Unlock()
	st.c.Store(c)
	c.addLocked(st)
	c.unlock()
	if err := st.aborted.Load(); err != nil {
		st.abort(*err) // cancelled or timed out while it moved; abort is idempotent
	}
}
