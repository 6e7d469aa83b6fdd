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
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/attempt"
	"github.com/clink-wasm/clink-wasm/host/lookup/internal/deadline"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
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

// stream is one exchange.
type stream struct {
	req      *http.Request
	body     []byte // request body still to send (a suffix of the original)
	a        *attempt.Attempt
	done     func(*http.Response, error)
	deadline time.Time
	hidx     int // index in the connection's deadline heap; -1 when not in it

	c       atomic.Pointer[conn]  // the connection st is assigned to; nil while it moves
	aborted atomic.Pointer[error] // an abort that came while st moved between connections

	// Guarded by the connection's mutex.
	id       uint32 // 0 until sent
	ended    bool   // done has been or is being called
	sendWin  int64  // the peer's window for this stream
	recvUsed int64  // bytes received since the last stream WINDOW_UPDATE

	// Owned by the reader goroutine.
	resp    *http.Response
	rbody   []byte
	gotHead bool
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

// abort ends st with err if it has not ended: the stream is reset if it was sent.
func (st *stream) abort(err error) {
	c := st.c.Load()
	if c == nil {
		st.aborted.Store(&err) // moving after a GOAWAY: requeue fails it
		if c = st.c.Load(); c == nil {
			return
		}
	}
	c.mu.Lock()
	for c2 := st.c.Load(); c2 != c; c2 = st.c.Load() { // moved by a GOAWAY: follow it
		c.mu.Unlock()
		if c = c2; c == nil {
			return // requeue sees st.aborted
		}
		c.mu.Lock()
	}
	if st.ended {
		c.mu.Unlock()
		return
	}
	if st.id != 0 && c.err == nil {
		c.fr.WriteRSTStream(st.id, http2.ErrCodeCancel)
	}
	c.endLocked(st)
	c.unlock()
	st.finish(nil, err)
}

// CancelAttempt implements attempt.Canceler: Cancel may be called with the caller's locks held
// (host/lookup's call.stop), so abort, which calls done, runs on its own goroutine.
func (st *stream) CancelAttempt() {
	go st.abort(&connError{op: "exchange", err: context.Canceled})
}

// finish calls done (no lock held).
func (st *stream) finish(resp *http.Response, err error) {
	st.a.Unbind()
	if err != nil && errors.Is(err, errTimeout) {
		err = &connError{op: "exchange", err: context.DeadlineExceeded}
	}
	st.done(resp, err)
}

// conn is one HTTP/2 connection.
type conn struct {
	t    *Transport
	addr string
	nc   net.Conn // set by the reader goroutine once dialled; guarded by mu until then

	mu sync.Mutex
	// Guarded by mu.
	err        error // the connection failed: no more streams
	ready      bool  // the server's SETTINGS arrived
	goingAway  bool
	streams    map[uint32]*stream
	queued     []*stream // waiting for the handshake or for a stream slot
	blocked    []*stream // sent, with body bytes waiting for flow-control credit
	load       int       // streams assigned: open and queued
	idle       *time.Timer
	nextID     uint32
	maxStreams int
	peerWindow int64 // the peer's initial stream window
	peerFrame  int
	sendWin    int64 // the peer's connection window
	connUsed   int64 // bytes received since the last connection WINDOW_UPDATE
	idleSince  time.Time
	out        outBuf // frames queued for the writer
	fr         *http2.Framer
	henc       *hpack.Encoder
	hbuf       []byte
	lower      map[string]string // canonical header name → lower case
	rc         syscall.RawConn   // nc's descriptor, for non-blocking writes; nil without one
	spare      []byte            // a write buffer to swap with out
	rest       []byte            // what a non-blocking write left, for the writer goroutine
	writing    bool              // a write is in progress
	handoff    bool              // the writer goroutine is the writer
	inBatch    bool              // the reader is handling frames it has buffered: it writes after
	unsent     int               // streams opened in out since the last write
	wcond      sync.Cond         // wakes the writer goroutine
	closed     chan struct{}

	deadlines deadline.Heap[*stream] // the assigned streams with a deadline; guarded by mu
	dtimer    *time.Timer            // fires at deadlines[0]; guarded by mu
	armed     time.Time              // when dtimer fires; zero when stopped; guarded by mu

	// Owned by the reader goroutine.
	hdec  *hpack.Decoder
	hb    headerBlock
	canon map[string]string // response field name → canonical form
}

// headerBlock is the header block being read (HEADERS and its CONTINUATIONs), decoded as
// it arrives: the fields go straight into the response, with no intermediate frame.
type headerBlock struct {
	open, endStream bool
	id              uint32
	room            int // header list bytes left before MaxResponseHeaderBytes
	status          string
	pseudoErr       string // a malformed or unexpected pseudo-header field
	regular         bool   // a regular field was seen (pseudo-fields must come first)
	fields          []hpack.HeaderField
	truncated       bool
}

// outBuf is the writer's pending bytes; the framer appends to it.
type outBuf struct{ b []byte }

func (o *outBuf) Write(p []byte) (int, error) { o.b = append(o.b, p...); return len(p), nil }

// hblock is the HPACK encoder's sink.
type hblock struct{ c *conn }

func (h hblock) Write(p []byte) (int, error) { h.c.hbuf = append(h.c.hbuf, p...); return len(p), nil }

func (t *Transport) newConnLocked(addr string) *conn {
	c := &conn{
		t: t, addr: addr, streams: make(map[uint32]*stream), nextID: 1,
		maxStreams: t.MaxStreamsPerConn, peerWindow: 65535, peerFrame: 16384, sendWin: 65535,
		lower: make(map[string]string), closed: make(chan struct{}),
	}
	c.wcond.L = &c.mu
	c.henc = hpack.NewEncoder(hblock{c})
	t.wg.Add(2)
	go c.readLoop()
	go c.writeLoop()
	return c
}

// addLocked assigns st to c: it is sent now, or queued until the handshake or a free slot.
func (c *conn) addLocked(st *stream) {
	if !st.deadline.IsZero() && c.err == nil {
		c.watchLocked(st)
	}
	c.load++
	if c.err != nil {
		// Failed between pick and now: fail st from a new goroutine (no lock in done).
		c.load--
		err := c.err
		st.ended = true
		go st.finish(nil, err)
		return
	}
	if !c.ready || len(c.streams) >= c.maxStreams || c.goingAway {
		c.queued = append(c.queued, st)
		return
	}
	c.sendLocked(st)
}

// sendLocked opens st's stream: HEADERS, CONTINUATION, and as much of the body as the
// windows allow.
func (c *conn) sendLocked(st *stream) {
	req := st.req
	st.id = c.nextID
	c.nextID += 2
	c.unsent++
	c.streams[st.id] = st
	st.sendWin = c.peerWindow

	c.hbuf = c.hbuf[:0]
	path := req.URL.RequestURI()
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	c.field(":method", req.Method, false)
	c.field(":scheme", "http", false)
	c.field(":authority", host, false)
	c.field(":path", path, false)
	for k, vs := range req.Header {
		switch k {
		case "Host", "Connection", "Proxy-Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Te", "Content-Length":
			continue // connection-specific in HTTP/1.1: not sent over HTTP/2 (RFC 9113 §8.2.2)
		}
		name, ok := c.lower[k]
		if !ok {
			name = strings.ToLower(k)
			if len(c.lower) < 256 {
				c.lower[k] = name
			}
		}
		sensitive := k == "Authorization" || k == "Proxy-Authorization" || k == "Cookie" || c.t.Sensitive[k]
		for _, v := range vs {
			c.field(name, v, sensitive)
		}
	}
	if len(st.body) > 0 {
		c.field("content-length", strconv.Itoa(len(st.body)), false)
	}
	block := c.hbuf
	endStream := len(st.body) == 0
	first := true
	for first || len(block) > 0 {
		n := min(len(block), c.peerFrame)
		frag := block[:n]
		block = block[n:]
		if first {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: frag, EndStream: endStream, EndHeaders: len(block) == 0})
			first = false
		} else {
			c.fr.WriteContinuation(st.id, len(block) == 0, frag)
		}
	}
	st.a.MarkWrote()
	// Queued for the next write, which follows at once unless one is in progress: the
	// upstream's share of the exchange starts about here (attempt.Attempt.Upstream).
	st.a.MarkSent(time.Now())
	if len(st.body) > 0 {
		c.sendBodyLocked(st)
	}
}

func (c *conn) field(name, value string, sensitive bool) {
	c.henc.WriteField(hpack.HeaderField{Name: name, Value: value, Sensitive: sensitive})
}

// sendBodyLocked sends what the windows allow of st's body; the rest waits in c.blocked.
// It reports whether the body is all sent.
func (c *conn) sendBodyLocked(st *stream) bool {
	for len(st.body) > 0 {
		n := int64(min(len(st.body), c.peerFrame))
		n = min(n, st.sendWin, c.sendWin)
		if n <= 0 {
			c.blocked = append(c.blocked, st)
			return false
		}
		chunk := st.body[:n]
		st.body = st.body[n:]
		st.sendWin -= n
		c.sendWin -= n
		c.fr.WriteData(st.id, len(st.body) == 0, chunk)
	}
	return true
}

// unblockLocked resumes bodies after the windows grew.
func (c *conn) unblockLocked() {
	if len(c.blocked) == 0 {
		return
	}
	b := c.blocked
	c.blocked = nil
	for i, st := range b {
		if st.ended {
			continue
		}
		if !c.sendBodyLocked(st) {
			// st went back into c.blocked; keep the others after it, in order.
			c.blocked = append(c.blocked, b[i+1:]...)
			break
		}
	}
}

// endLocked removes st from c (it ends now) and starts a queued stream in its slot.
func (c *conn) endLocked(st *stream) {
	st.ended = true
	c.unwatchLocked(st)
	c.load--
	if st.id != 0 {
		delete(c.streams, st.id)
	} else {
		for i, q := range c.queued {
			if q == st {
				c.queued = append(c.queued[:i], c.queued[i+1:]...)
				break
			}
		}
	}
	c.startQueuedLocked()
	if len(c.streams) == 0 && len(c.queued) == 0 {
		c.idleSince = time.Now()
		if c.goingAway && c.err == nil {
			c.err = errors.New("h2: connection drained after GOAWAY")
			c.closeLocked()
			return
		}
		if c.idle == nil {
			c.idle = time.AfterFunc(c.t.IdleConnTimeout, c.closeIfIdle)
		} else {
			c.idle.Reset(c.t.IdleConnTimeout)
		}
	}
}

// closeIfIdle closes c if it has had no stream for IdleConnTimeout.
func (c *conn) closeIfIdle() {
	c.mu.Lock()
	idle := c.err == nil && len(c.streams) == 0 && len(c.queued) == 0
	if idle {
		if left := c.t.IdleConnTimeout - time.Since(c.idleSince); left > 0 {
			c.idle.Reset(left)
			idle = false
		}
	}
	c.mu.Unlock()
	if idle {
		c.fail(&connError{op: "idle", err: errors.New("connection idle")})
	}
}

func (c *conn) startQueuedLocked() {
	for c.ready && c.err == nil && !c.goingAway && len(c.queued) > 0 && len(c.streams) < c.maxStreams {
		st := c.queued[0]
		c.queued = c.queued[1:]
		c.sendLocked(st)
	}
}

// closeLocked closes the socket and wakes the writer; the reader then fails.
func (c *conn) closeLocked() {
	select {
	case <-c.closed:
	default:
		close(c.closed)
		if c.nc != nil {
			c.nc.Close()
		}
	}
	c.wcond.Broadcast()
}

// fail ends c with err: every stream on it fails (with ErrRefused wrapped if the request
// was never sent), the socket is closed and c leaves the pool.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.closeLocked()
	if c.idle != nil {
		c.idle.Stop()
	}
	if c.dtimer != nil {
		c.dtimer.Stop()
	}
	c.deadlines.Clear()
	var ended []*stream
	for _, st := range c.streams {
		if !st.ended {
			st.ended = true
			ended = append(ended, st)
		}
	}
	for _, st := range c.queued {
		if !st.ended {
			st.ended = true
			ended = append(ended, st)
		}
	}
	c.streams = map[uint32]*stream{}
	c.queued = nil
	c.blocked = nil
	c.load = 0
	c.mu.Unlock()
	c.t.retire(c)
	for _, st := range ended {
		e := err
		if st.id == 0 {
			e = &connError{op: "dial", err: err}
		}
		st.finish(nil, e)
	}
}

// Writing. Frames are appended to c.out under c.mu, and written by whoever releases c.mu
// next (unlock), with one non-blocking system call, unless a write is in progress (its
// writer then loops) or the reader is in a batch: the frames it reads back to back come
// out of one buffered read, and their completions queue frames that the reader writes
// together before it reads again. A write that would block (a full socket buffer), and
// every write on a connection without a file descriptor, is handed to the writer
// goroutine, which may block: Start's callers and the reader never do.

// unlock releases c.mu, writing the queued frames first (see above).
func (c *conn) unlock() {
	for !c.inBatch && !c.writing && len(c.out.b) > 0 && c.ready && c.err == nil {
		if c.rc == nil {
			c.handoffLocked(nil)
			break
		}
		c.writing = true
		b := c.out.b
		c.out.b = c.spare[:0]
		c.spare = nil
		c.unsent = 0
		c.mu.Unlock()
		n, err := c.tryWrite(b)
		c.mu.Lock()
		c.writing = false
		if err != nil {
			c.mu.Unlock()
			c.fail(&connError{op: "write", err: err})
			return
		}
		if n < len(b) {
			c.handoffLocked(b[n:])
			break
		}
		if cap(b) <= maxKeptWrite {
			c.spare = b[:0]
		}
	}
	c.mu.Unlock()
}

// handoffLocked makes the writer goroutine the writer: it sends rest, then c.out until
// it is empty.
func (c *conn) handoffLocked(rest []byte) {
	c.writing = true
	c.rest = rest
	c.handoff = true
	c.wcond.Signal()
}

// writeLoop is the writer goroutine (see unlock).
func (c *conn) writeLoop() {
	defer c.t.wg.Done()
	var spare []byte
	for {
		c.mu.Lock()
		for c.err == nil && !c.handoff {
			c.wcond.Wait()
		}
		if c.err != nil {
			c.mu.Unlock()
			return
		}
		b := c.rest
		c.rest = nil
		if len(b) == 0 {
			b = c.out.b
			c.out.b = spare[:0]
			spare = nil
		}
		if len(b) == 0 {
			c.handoff, c.writing = false, false
			c.mu.Unlock()
			continue
		}
		nc := c.nc
		c.mu.Unlock()
		_, err := nc.Write(b)
		if err != nil {
			c.fail(&connError{op: "write", err: err})
			return
		}
		if spare == nil && cap(b) <= maxKeptWrite {
			spare = b[:0]
		}
	}
}

// readLoop dials, runs the handshake, and then reads frames until the connection fails.
func (c *conn) readLoop() {
	defer c.t.wg.Done()
	br, err := c.handshake()
	if err != nil {
		c.fail(err)
		return
	}
	fr := http2.NewFramer(nil, br)
	fr.SetReuseFrames()
	fr.SetMaxReadFrameSize(maxFrameRead)
	c.hdec = hpack.NewDecoder(4096, c.onField)
	c.canon = make(map[string]string)
	c.hdec.SetMaxStringLength(c.t.MaxResponseHeaderBytes)
	batch := false
	for {
		if !wholeFrameBuffered(br) {
			// The next read may wait: write what this batch queued first.
			if batch {
				c.mu.Lock()
				c.inBatch = false
				c.unlock()
				batch = false
			}
		} else if !batch {
			c.mu.Lock()
			c.inBatch = true
			c.mu.Unlock()
			batch = true
		}
		if batch {
			c.mu.Lock()
			if c.unsent >= batchFlush {
				// A long batch: send the requests its completions made so far, so that
				// the first of them do not wait for the last response to be handled.
				c.inBatch = false
				c.unlock()
				c.mu.Lock()
				c.inBatch = true
			}
			c.mu.Unlock()
		}
		f, err := fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) && !c.hb.open {
				c.streamFailed(se.StreamID, &StreamError{Code: se.Code, Reason: "malformed response: " + se.Error()}, true)
				continue
			}
			c.fail(&connError{op: "read", err: err})
			return
		}
		if err := c.handle(f); err != nil {
			c.mu.Lock()
			if c.err == nil {
				c.fr.WriteGoAway(0, http2.ErrCodeProtocol, nil)
				c.inBatch = false // written now, before the connection closes
			}
			c.unlock()
			c.fail(&connError{op: "read", err: err})
			return
		}
	}
}

// wholeFrameBuffered reports whether br holds a whole frame, so that reading it will not
// wait on the network.
func wholeFrameBuffered(br *bufio.Reader) bool {
	n := br.Buffered()
	if n < 9 {
		return false
	}
	h, _ := br.Peek(9)
	return n >= 9+int(h[0])<<16|int(h[1])<<8|int(h[2])
}

// handshake dials and exchanges the connection prefaces (RFC 9113 §3.4): the client
// preface, SETTINGS and a connection WINDOW_UPDATE out, the server's SETTINGS in.
func (c *conn) handshake() (*bufio.Reader, error) {
	ctx := c.t.Context
	c.mu.Lock()
	var deadline time.Time
	for _, st := range c.queued {
		if !st.deadline.IsZero() && (deadline.IsZero() || st.deadline.Before(deadline)) {
			deadline = st.deadline
		}
	}
	c.mu.Unlock()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	nc, err := c.t.Dial(ctx, "tcp", c.addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		nc.Close()
		return nil, c.err
	}
	c.nc = nc
	c.mu.Unlock()
	if !deadline.IsZero() {
		nc.SetDeadline(deadline)
	}
	var hs outBuf
	hs.b = append(hs.b, http2.ClientPreface...)
	wf := http2.NewFramer(&hs, nil)
	wf.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: maxFrameRead},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: uint32(c.t.MaxResponseHeaderBytes)},
	)
	wf.WriteWindowUpdate(0, connWindow-65535)
	if _, err := nc.Write(hs.b); err != nil {
		return nil, &connError{op: "write preface", err: err}
	}
	br := bufio.NewReaderSize(nc, readBufSize)
	rf := http2.NewFramer(nil, br)
	f, err := rf.ReadFrame()
	if err != nil {
		return nil, &connError{op: "read server preface", err: err}
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		return nil, &connError{op: "read server preface", err: errors.New("first frame is not SETTINGS (not an HTTP/2 server?)")}
	}
	nc.SetDeadline(time.Time{})
	rc := rawConn(nc)
	c.mu.Lock()
	defer c.unlock()
	if c.err != nil {
		return nil, c.err
	}
	c.rc = rc
	c.fr = http2.NewFramer(&c.out, nil)
	if err := c.applySettingsLocked(sf); err != nil {
		return nil, err
	}
	c.fr.WriteSettingsAck()
	c.ready = true
	c.startQueuedLocked()
	if len(c.queued) > 0 {
		// More streams than the server allows on one connection: the rest go to others.
		excess := c.queued
		c.queued = nil
		c.load -= len(excess)
		for _, st := range excess {
			c.unwatchLocked(st)
			st.c.Store(nil)
		}
		go func() {
			for _, st := range excess {
				c.t.requeue(st)
			}
		}()
	}
	return br, nil
}

func (c *conn) applySettingsLocked(sf *http2.SettingsFrame) error {
	return sf.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingMaxConcurrentStreams:
			c.maxStreams = int(max(1, min(s.Val, uint32(c.t.MaxStreamsPerConn)))) // 0 would strand queued streams
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerWindow
			c.peerWindow = int64(s.Val)
			for _, st := range c.streams {
				st.sendWin += delta
			}
		case http2.SettingMaxFrameSize:
			c.peerFrame = int(s.Val)
		case http2.SettingHeaderTableSize:
			c.henc.SetMaxDynamicTableSizeLimit(s.Val)
		}
		return nil
	})
}

// handle processes one frame on the reader goroutine. An error is a connection error.
func (c *conn) handle(f http2.Frame) error {
	if _, ok := f.(*http2.ContinuationFrame); c.hb.open && !ok {
		return errors.New("frame inside a header block")
	}
	switch f := f.(type) {
	case *http2.HeadersFrame:
		if c.hb.open {
			return errors.New("HEADERS inside a header block")
		}
		c.hb = headerBlock{open: true, id: f.StreamID, endStream: f.StreamEnded(), room: c.t.MaxResponseHeaderBytes, fields: c.hb.fields[:0]}
		return c.headerFragment(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.ContinuationFrame:
		if !c.hb.open || f.StreamID != c.hb.id {
			return errors.New("unexpected CONTINUATION")
		}
		return c.headerFragment(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.RSTStreamFrame:
		err := error(&StreamError{Code: f.ErrCode})
		if f.ErrCode == http2.ErrCodeRefusedStream {
			err = ErrRefused
		}
		c.streamFailed(f.StreamID, err, false)
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		c.mu.Lock()
		err := c.applySettingsLocked(f)
		if err == nil {
			c.fr.WriteSettingsAck()
			c.unblockLocked()
			c.startQueuedLocked()
		}
		c.unlock()
		return err
	case *http2.PingFrame:
		if !f.IsAck() {
			c.mu.Lock()
			c.fr.WritePing(true, f.Data)
			c.unlock()
		}
	case *http2.WindowUpdateFrame:
		c.mu.Lock()
		if f.StreamID == 0 {
			c.sendWin += int64(f.Increment)
			if c.sendWin > 1<<31-1 {
				c.unlock()
				return errors.New("connection flow-control window overflow")
			}
		} else if st := c.streams[f.StreamID]; st != nil {
			st.sendWin += int64(f.Increment)
		}
		c.unblockLocked()
		c.unlock()
	case *http2.GoAwayFrame:
		c.onGoAway(f)
	case *http2.PushPromiseFrame:
		return errors.New("PUSH_PROMISE received with push disabled")
	}
	return nil
}

func (c *conn) lookup(id uint32) *stream {
	c.mu.Lock()
	st := c.streams[id]
	if st != nil && st.ended {
		st = nil
	}
	c.mu.Unlock()
	return st
}

// headerFragment decodes a fragment of the open header block, and takes the block once it
// ends. A decoding error is a connection error: the HPACK state is lost (RFC 9113 §4.3).
func (c *conn) headerFragment(frag []byte, end bool) error {
	hb := &c.hb
	if len(frag) > 2*hb.room+64 {
		hb.truncated = true // far beyond the limit: stop decoding (the table still must be)
	}
	if _, err := c.hdec.Write(frag); err != nil {
		return fmt.Errorf("HPACK: %w", err)
	}
	if !end {
		return nil
	}
	if err := c.hdec.Close(); err != nil {
		return fmt.Errorf("HPACK: %w", err)
	}
	hb.open = false
	err := c.onHeaders(hb)
	clear(hb.fields)
	hb.fields = hb.fields[:0]
	return err
}

// onField is the HPACK decoder's emit function: it sorts a field into c.hb.
func (c *conn) onField(f hpack.HeaderField) {
	hb := &c.hb
	hb.room -= int(f.Size())
	if hb.room < 0 || hb.truncated {
		hb.truncated = true
		return
	}
	if f.IsPseudo() {
		switch {
		case hb.regular:
			hb.pseudoErr = "pseudo-header field after a regular one"
		case f.Name == ":status" && hb.status == "":
			hb.status = f.Value
		default:
			hb.pseudoErr = "unexpected pseudo-header field " + f.Name
		}
		return
	}
	hb.regular = true
	hb.fields = append(hb.fields, f)
}

// onHeaders takes a decoded header block: a response head (1xx heads are skipped) or
// trailers.
func (c *conn) onHeaders(hb *headerBlock) error {
	id := hb.id
	st := c.lookup(id)
	if st == nil {
		if id >= c.peekNextID() {
			return fmt.Errorf("HEADERS on idle stream %d", id)
		}
		return nil // a stream we reset
	}
	if hb.truncated {
		c.streamFailed(id, &StreamError{Code: http2.ErrCodeCancel, Reason: "response header list exceeds " + strconv.Itoa(c.t.MaxResponseHeaderBytes) + " bytes"}, true)
		return nil
	}
	if st.gotHead { // trailers
		if !hb.endStream || hb.status != "" || hb.pseudoErr != "" {
			c.streamFailed(id, &StreamError{Code: http2.ErrCodeProtocol, Reason: "malformed trailers"}, true)
			return nil
		}
		for _, hf := range hb.fields {
			if st.resp.Trailer == nil {
				st.resp.Trailer = http.Header{}
			}
			st.resp.Trailer.Add(http.CanonicalHeaderKey(hf.Name), hf.Value)
		}
		c.complete(st)
		return nil
	}
	if hb.pseudoErr != "" {
		c.streamFailed(id, &StreamError{Code: http2.ErrCodeProtocol, Reason: hb.pseudoErr}, true)
		return nil
	}
	status, err := strconv.Atoi(hb.status)
	if err != nil || status < 100 || status > 999 {
		c.streamFailed(id, &StreamError{Code: http2.ErrCodeProtocol, Reason: "malformed :status"}, true)
		return nil
	}
	if status < 200 {
		if status == 101 || hb.endStream {
			c.streamFailed(id, &StreamError{Code: http2.ErrCodeProtocol, Reason: "unexpected " + strconv.Itoa(status) + " response"}, true)
		}
		return nil // interim response: the final one follows
	}
	st.a.MarkAnswered(time.Now())
	h := make(http.Header, len(hb.fields))
	vals := make([]string, len(hb.fields)) // one backing array for the common one value per name
	cl := int64(-1)
	for i, hf := range hb.fields {
		if !validFieldName(hf.Name) {
			c.streamFailed(id, &StreamError{Code: http2.ErrCodeProtocol, Reason: "invalid header field name"}, true)
			return nil
		}
		k, ok := c.canon[hf.Name]
		if !ok {
			k = http.CanonicalHeaderKey(hf.Name)
			if len(c.canon) < 256 {
				c.canon[hf.Name] = k
			}
		}
		if vs, ok := h[k]; ok {
			h[k] = append(vs, hf.Value)
		} else {
			vals[i] = hf.Value
			h[k] = vals[i : i+1 : i+1]
		}
		if k == "Content-Length" {
			n, err := strconv.ParseInt(hf.Value, 10, 64)
			if err != nil || n < 0 || (cl >= 0 && n != cl) {
				c.streamFailed(id, &StreamError{Code: http2.ErrCodeProtocol, Reason: "malformed content-length"}, true)
				return nil
			}
			cl = n
		}
	}
	if max := c.t.MaxBodyBytes; max > 0 && cl > max {
		c.streamFailed(id, attempt.ErrBodyTooLarge, true)
		return nil
	}
	st.gotHead = true
	st.resp = &http.Response{
		Status: statusLine(status), StatusCode: status,
		Proto: "HTTP/2.0", ProtoMajor: 2, Header: h, ContentLength: cl, Request: st.req,
	}
	if cl > 0 {
		st.rbody = make([]byte, 0, cl)
	}
	if hb.endStream {
		c.complete(st)
	}
	return nil
}

// validFieldName: a lower-case token (RFC 9113 §8.2.1: upper case is malformed).
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b >= 'A' && b <= 'Z' || b <= ' ' || b >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", b) >= 0 {
			return false
		}
	}
	return true
}

func (c *conn) peekNextID() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nextID
}

// onData takes a DATA frame: flow control first (even for streams that ended), then the
// body, bounded by MaxBodyBytes.
func (c *conn) onData(f *http2.DataFrame) error {
	n := int64(f.Length)
	c.mu.Lock()
	c.connUsed += n
	if c.connUsed >= connWindow/2 {
		c.fr.WriteWindowUpdate(0, uint32(c.connUsed))
		c.connUsed = 0
	}
	st := c.streams[f.StreamID]
	if st != nil && st.ended {
		st = nil
	}
	if st != nil && !f.StreamEnded() {
		st.recvUsed += n
		if st.recvUsed >= streamWindow/2 {
			c.fr.WriteWindowUpdate(st.id, uint32(st.recvUsed))
			st.recvUsed = 0
		}
	}
	c.unlock()
	if st == nil {
		return nil // a stream we reset: its data still counted against the windows above
	}
	if !st.gotHead {
		c.streamFailed(f.StreamID, &StreamError{Code: http2.ErrCodeProtocol, Reason: "DATA before the response head"}, true)
		return nil
	}
	data := f.Data()
	if max := c.t.MaxBodyBytes; max > 0 && int64(len(st.rbody)+len(data)) > max {
		c.streamFailed(f.StreamID, attempt.ErrBodyTooLarge, true)
		return nil
	}
	st.rbody = append(st.rbody, data...)
	if f.StreamEnded() {
		if cl := st.resp.ContentLength; cl >= 0 && int64(len(st.rbody)) != cl {
			c.streamFailed(f.StreamID, &StreamError{Code: http2.ErrCodeProtocol, Reason: "body length differs from content-length"}, true)
			return nil
		}
		c.complete(st)
	}
	return nil
}

// complete ends st with its response.
func (c *conn) complete(st *stream) {
	c.mu.Lock()
	if st.ended {
		c.mu.Unlock()
		return
	}
	if len(st.body) > 0 {
		// The server answered before the whole request body was sent: stop sending it.
		c.fr.WriteRSTStream(st.id, http2.ErrCodeNo)
	}
	c.endLocked(st)
	c.unlock()
	resp := st.resp
	if resp.ContentLength < 0 {
		resp.ContentLength = int64(len(st.rbody))
	}
	resp.Body = &body{b: st.rbody}
	st.finish(resp, nil)
}

// streamFailed ends stream id with err; reset says whether to send RST_STREAM.
func (c *conn) streamFailed(id uint32, err error, reset bool) {
	c.mu.Lock()
	st := c.streams[id]
	if st == nil || st.ended {
		c.mu.Unlock()
		return
	}
	if reset && c.err == nil {
		c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
	}
	c.endLocked(st)
	c.unlock()
	st.finish(nil, err)
}

// onGoAway stops new streams on c and fails those the server did not process.
func (c *conn) onGoAway(f *http2.GoAwayFrame) {
	c.mu.Lock()
	c.goingAway = true
	var refused []*stream
	for id, st := range c.streams {
		if id > f.LastStreamID && !st.ended {
			refused = append(refused, st)
		}
	}
	queued := c.queued // never sent: they move to another connection
	c.queued = nil
	for _, st := range queued {
		c.unwatchLocked(st)
		st.c.Store(nil)
	}
	c.load -= len(queued)
	c.mu.Unlock()
	c.t.retire(c)
	for _, st := range refused {
		c.streamFailed(st.id, ErrRefused, false)
	}
	for _, st := range queued {
		c.t.requeue(st)
	}
	c.mu.Lock()
	if len(c.streams) == 0 && c.err == nil {
		c.err = errors.New("h2: connection closed after GOAWAY")
		c.closeLocked()
	}
	c.mu.Unlock()
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

// body is a response body read in full; Bytes lets host/lookup take it without a copy.
type body struct {
	b   []byte
	off int
}

func (b *body) Read(p []byte) (int, error) {
	if b.off >= len(b.b) {
		return 0, io.EOF
	}
	n := copy(p, b.b[b.off:])
	b.off += n
	return n, nil
}

func (b *body) Close() error  { return nil }
func (b *body) Bytes() []byte { return b.b }

// Deadlines: each connection keeps its streams with a deadline in a min-heap and one timer
// for the earliest, instead of a timer per stream.

// The deadline heap's view of a stream.
func (st *stream) Before(o *stream) bool { return st.deadline.Before(o.deadline) }
func (st *stream) SetIndex(i int)        { st.hidx = i }
func (st *stream) Index() int            { return st.hidx }

// watchLocked adds st to c's deadlines and arms the timer if st is the earliest.
func (c *conn) watchLocked(st *stream) {
	c.deadlines.Push(st)
	if c.armed.IsZero() || st.deadline.Before(c.armed) {
		c.armLocked(st.deadline)
	}
}

func (c *conn) unwatchLocked(st *stream) {
	c.deadlines.Remove(st)
	// The timer stays armed: when it fires early it re-arms for the new earliest.
}

func (c *conn) armLocked(at time.Time) {
	c.armed = at
	d := time.Until(at)
	if c.dtimer == nil {
		c.dtimer = time.AfterFunc(d, c.expire)
	} else {
		c.dtimer.Reset(d)
	}
}

// expire aborts the streams whose deadline has passed and re-arms for the next.
func (c *conn) expire() {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	now := time.Now()
	var due []*stream
	for c.deadlines.Len() > 0 && !c.deadlines.Min().deadline.After(now) {
		due = append(due, c.deadlines.Pop())
	}
	c.armed = time.Time{}
	if c.deadlines.Len() > 0 {
		c.armLocked(c.deadlines.Min().deadline)
	}
	c.unlock()
	for _, st := range due {
		st.abort(&connError{op: "exchange", err: errTimeout})
	}
}

// statusLines holds "200 OK" and the like, so that a response does not build its status.
var statusLines = func() (l [600]string) {
	for i := 200; i < len(l); i++ {
		if t := http.StatusText(i); t != "" {
			l[i] = strconv.Itoa(i) + " " + t
		}
	}
	return l
}()

func statusLine(code int) string {
	if code < len(statusLines) && statusLines[code] != "" {
		return statusLines[code]
	}
	return strconv.Itoa(code)
}
