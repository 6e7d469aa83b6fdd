// Package h1 is a lean HTTP/1.1 client transport for plain http:// upstreams: an
// [http.RoundTripper] that writes the request and reads the response head on the caller's
// goroutine, over a pooled keep-alive connection. It is the seed engine's HttpPool design in
// Go.
//
// net/http's Transport runs two goroutines per connection (a read loop and a write loop) and
// hands every request and response between them and the caller over channels. Under load
// on a small machine those hand-offs cost as much CPU as the HTTP work itself (host/lookup's
// DESIGN.md has the profile). Here a request costs one write system call and the reads its
// response needs, on the goroutine that asked; the wait for the response is not preceded by
// a read that could only fail (wait_unix.go).
//
// # What it handles, and what it does not
//
// Handled: http:// URLs, requests without a body or with a body of known length, responses
// framed by Content-Length, by chunked transfer coding, or by the connection closing, interim
// 1xx responses (skipped), keep-alive with an idle pool per host.
//
// Everything else goes to [Transport.Fallback] (net/http's Transport in host/lookup), decided
// before anything is sent: https, a body of unknown length, Expect, Upgrade, request
// trailers or transfer codings, CONNECT. Without a fallback such requests fail with
// [ErrUnsupported]. A response it does not accept (another transfer coding, conflicting
// lengths, malformed syntax, a head over the limits) is a [*ProtocolError] and its connection
// is closed: it cannot be handed on, because the request was already sent.
//
// # Strictness
//
// The upstream of a guest's lookup may be hostile, so responses are parsed strictly
// (RFC 9112): CRLF line ends only; "HTTP/1.0" or "HTTP/1.1" and a three-digit status from 100
// to 599; header names that are tokens with the colon right after them; no obs-fold; no
// control bytes other than HTAB in values; Content-Length as digits only, repeated only with
// the same value, never together with Transfer-Encoding; chunk sizes in at most 15 hex
// digits. The status line and header fields together (interim responses and trailers
// included) are bounded by MaxResponseHeaderBytes and MaxHeaderCount; a body by MaxBodyBytes.
// A connection is reused only after a response was read exactly to its end with nothing
// left over, and never after any error.
//
// # Deadlines and cancellation
//
// An exchange (request, response head and body) is bounded by a deadline and can be
// cancelled. The deadline is the connection's own (net.Conn.SetDeadline), so an exchange
// needs no timer of its own; cancelling sets that deadline in the past, which wakes any
// blocked read or write, and the connection is then closed instead of reused. A reused
// connection keeps the deadline an earlier exchange set while it is no later than the new
// exchange's and leaves it at least half of its time (keepDeadline): setting it moves a
// runtime timer, and a busy connection would move it on every exchange. An exchange still
// running when that earlier deadline passes moves it to its own and goes on (conn.early).
// [Transport.RoundTrip] takes both from the request's context (watched with
// [context.AfterFunc]); its errors then wrap the context's error, so
// errors.Is(err, context.DeadlineExceeded) holds for a timeout. [Transport.Exchange] takes them
// from an [Attempt], which a caller that sends many short requests (host/lookup) reuses:
// no context, no allocation and no timer per request.
package h1

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/attempt"
)

// Transport is an HTTP/1.1 client transport; see the package documentation. Set its fields
// before the first request and do not change them afterwards. Its methods are safe for
// concurrent use.
type Transport struct {
	// Dial opens a connection to "host:port". Required. Every new connection goes through it;
	// host/lookup passes the endpoint's guarded dialer, which runs the egress checks first.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Fallback serves the requests this transport does not handle. Nil: they fail with
	// ErrUnsupported.
	Fallback http.RoundTripper
	// MaxIdleConnsPerHost bounds the idle pool of one host:port. Default 64.
	MaxIdleConnsPerHost int
	// IdleConnTimeout closes connections idle longer than this. Default 90s.
	IdleConnTimeout time.Duration
	// MaxResponseHeaderBytes bounds a response's status line and header fields, interim
	// responses and trailers included. Default 64 KiB.
	MaxResponseHeaderBytes int
	// MaxHeaderCount bounds the header fields of a response (and its trailer fields,
	// separately). Default 128.
	MaxHeaderCount int
	// MaxBodyBytes, if positive, bounds a response body: reading past it fails with
	// ErrBodyTooLarge (at once when Content-Length says so).
	MaxBodyBytes int64
	// HeadersFor, if set, says for which final response statuses the caller reads the
	// header fields: for the others Header is nil, which saves the header map and the copy
	// of the head (every field is still parsed, checked and counted, and framing fields
	// still frame the body). Nil: every response has its Header.
	HeadersFor func(status int) bool

	once  sync.Once
	pool  pool
	addrs atomic.Pointer[addrEntry] // the last URL host and its dial address
}

type addrEntry struct{ host, addr string }

// Defaults.
const (
	DefaultMaxIdleConnsPerHost    = 64
	DefaultIdleConnTimeout        = 90 * time.Second
	DefaultMaxResponseHeaderBytes = 64 << 10
	DefaultMaxHeaderCount         = 128

	maxInterim   = 8 // interim (1xx) responses skipped before the final one
	probeIdle    = 2 * time.Second
	maxAwaitIdle = 100 * time.Millisecond // see conn.awaitOK
	maxKeptWrite = 64 << 10               // a connection keeps a write buffer up to this size
	readBufSize  = 4 << 10
)

// Errors.
var (
	// ErrUnsupported: the request needs a feature this transport does not implement and
	// there is no Fallback.
	ErrUnsupported = errors.New("h1: request not supported by the HTTP/1.1 fast path")
	// ErrBodyTooLarge: the response body exceeds MaxBodyBytes.
	ErrBodyTooLarge = attempt.ErrBodyTooLarge
	// ErrClosed: the transport was closed.
	ErrClosed = errors.New("h1: transport closed")
	// errServerClosed: the server closed the connection before sending any byte of a response.
	errServerClosed = errors.New("h1: server closed the connection before responding")
)

// ProtocolError reports a response this transport does not accept. The connection it came
// on is closed.
type ProtocolError struct{ Reason string }

func (e *ProtocolError) Error() string { return "h1: malformed response: " + e.Reason }

func protoErr(reason string) error { return &ProtocolError{Reason: reason} }

func (t *Transport) init() {
	t.once.Do(func() {
		if t.MaxIdleConnsPerHost <= 0 {
			t.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
		}
		if t.IdleConnTimeout <= 0 {
			t.IdleConnTimeout = DefaultIdleConnTimeout
		}
		if t.MaxResponseHeaderBytes <= 0 {
			t.MaxResponseHeaderBytes = DefaultMaxResponseHeaderBytes
		}
		if t.MaxHeaderCount <= 0 {
			t.MaxHeaderCount = DefaultMaxHeaderCount
		}
		t.pool.idle = make(map[string][]*conn)
		t.pool.active.next, t.pool.active.prev = &t.pool.active, &t.pool.active
	})
}

// Handles reports whether req would be served by this transport rather than by Fallback.
func (t *Transport) Handles(req *http.Request) bool {
	u := req.URL
	if u == nil || u.Scheme != "http" || u.Host == "" || req.Method == http.MethodConnect {
		return false
	}
	if req.Body != nil && req.Body != http.NoBody && req.ContentLength <= 0 {
		return false // unknown length: would need a chunked request body
	}
	if len(req.TransferEncoding) > 0 || len(req.Trailer) > 0 {
		return false
	}
	for k := range req.Header {
		switch k {
		case "Expect", "Upgrade", "Transfer-Encoding", "Trailer":
			return false
		}
	}
	return true
}

// RoundTrip implements http.RoundTripper: the deadline and cancellation come from the
// request's context.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.init()
	if !t.Handles(req) {
		if t.Fallback != nil {
			return t.Fallback.RoundTrip(req)
		}
		closeBody(req)
		return nil, ErrUnsupported
	}
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeBody(req)
		return nil, err
	}
	a := &Attempt{RequestContext: ctx, Context: ctx}
	a.Deadline, _ = ctx.Deadline()
	if ctx.Done() != nil {
		a.StopWatch = context.AfterFunc(ctx, a.Cancel)
	}
	return t.exchange(req, a)
}

// Exchange sends req and reads the response head within a's deadline; the response body is
// read within it too, and a.Cancel aborts either. req's context is not consulted. A request
// that Handles refuses fails with ErrUnsupported (Fallback is for RoundTrip). a must not be
// reused before the response body has been read to its end or closed.
func (t *Transport) Exchange(req *http.Request, a *Attempt) (*http.Response, error) {
	t.init()
	if !t.Handles(req) {
		closeBody(req)
		return nil, ErrUnsupported
	}
	return t.exchange(req, a)
}

// Attempt is the deadline and cancellation of one exchange (internal/attempt), shared with
// the other transports.
type Attempt = attempt.Attempt

// wrap returns the error an exchange reports for err: the context's error when the context
// ended (RoundTrip), context.Canceled after Cancel, context.DeadlineExceeded once the
// deadline has passed, ErrClosed after Transport.Close, else err itself.
func wrap(a *Attempt, op string, err error, killed bool) error {
	switch {
	case a.RequestContext != nil && a.RequestContext.Err() != nil:
		return &opError{op: op, err: a.RequestContext.Err()}
	case a.Cancelled():
		return &opError{op: op, err: context.Canceled}
	case errors.Is(err, os.ErrDeadlineExceeded) && !a.Deadline.IsZero() && !time.Now().Before(a.Deadline):
		return &opError{op: op, err: context.DeadlineExceeded}
	case killed:
		return &opError{op: op, err: ErrClosed}
	}
	var pe *ProtocolError
	if errors.As(err, &pe) || err == ErrBodyTooLarge {
		return err
	}
	return &opError{op: op, err: err}
}

func (t *Transport) exchange(req *http.Request, a *Attempt) (*http.Response, error) {
	addr := t.addr(req.URL)
	// Replay-safe: the request may be sent again on a fresh connection if a reused one
	// turns out to be dead before any response byte arrives (RFC 9112 §9.3.1).
	replayable := idempotent(req) && (req.Body == nil || req.Body == http.NoBody || req.GetBody != nil)
	for try := 0; ; try++ {
		c, err := t.getConn(a, addr, !replayable)
		if err != nil {
			a.Disown()
			closeBody(req)
			return nil, wrap(a, "dial", err, false)
		}
		resp, err := c.roundTrip(req, a)
		if err == nil {
			return resp, nil
		}
		var se *staleError
		if try > 0 || !errors.As(err, &se) || !(replayable || se.nothingWritten) {
			closeBody(req)
			return nil, unwrapStale(err)
		}
		if req.Body != nil && req.Body != http.NoBody {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, unwrapStale(err)
			}
			r2 := *req
			r2.Body = body
			req = &r2
		}
	}
}

// CloseIdleConnections closes the pooled connections. Connections in use are pooled again
// when their exchange ends.
func (t *Transport) CloseIdleConnections() {
	t.init()
	t.pool.mu.Lock()
	idle := t.pool.idle
	t.pool.idle = make(map[string][]*conn)
	t.pool.mu.Unlock()
	for _, cs := range idle {
		for _, c := range cs {
			c.nc.Close()
		}
	}
}

// Close closes the idle connections and aborts the exchanges in progress (they fail with
// ErrClosed); later exchanges fail with ErrClosed at once.
func (t *Transport) Close() {
	t.init()
	t.pool.mu.Lock()
	t.pool.closed = true
	idle := t.pool.idle
	t.pool.idle = make(map[string][]*conn)
	for c := t.pool.active.next; c != &t.pool.active; c = c.next {
		c.killed.Store(true)
		c.nc.SetDeadline(aLongTimeAgo)
	}
	t.pool.mu.Unlock()
	for _, cs := range idle {
		for _, c := range cs {
			c.nc.Close()
		}
	}
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// idempotent per RFC 9110 §9.2.2, or declared so by the caller as net/http understands it.
func idempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	_, ok := req.Header["Idempotency-Key"]
	if !ok {
		_, ok = req.Header["X-Idempotency-Key"]
	}
	return ok
}

// addr returns the dial address of u ("host:port"), cached for the last host asked for: a
// transport usually serves one origin.
func (t *Transport) addr(u *url.URL) string {
	if e := t.addrs.Load(); e != nil && e.host == u.Host {
		return e.addr
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	a := net.JoinHostPort(u.Hostname(), port)
	t.addrs.Store(&addrEntry{host: u.Host, addr: a})
	return a
}

// pool holds idle connections per host:port, most recently used last (LIFO: warm
// connections are reused, and the oldest age out at the bottom), and the connections in
// use, so that Close can abort them.
type pool struct {
	mu     sync.Mutex
	idle   map[string][]*conn // guarded by mu
	active conn               // sentinel of the ring of connections in use; guarded by mu
	closed bool               // guarded by mu
}

func (p *pool) addActiveLocked(c *conn) {
	c.prev, c.next = p.active.prev, &p.active
	c.prev.next, p.active.prev = c, c
}

func (p *pool) removeActiveLocked(c *conn) {
	if c.next != nil {
		c.prev.next, c.next.prev = c.next, c.prev
		c.prev, c.next = nil, nil
	}
}

// getConn returns an idle connection for addr, or dials one. probe asks for a liveness check
// of an idle connection before it is handed out (for requests that cannot be replayed).
func (t *Transport) getConn(a *Attempt, addr string, probe bool) (*conn, error) {
	now := time.Now()
	for {
		t.pool.mu.Lock()
		if t.pool.closed {
			t.pool.mu.Unlock()
			return nil, ErrClosed
		}
		cs := t.pool.idle[addr]
		// Age out from the bottom (oldest).
		n := 0
		for n < len(cs) && now.Sub(cs[n].idleAt) > t.IdleConnTimeout {
			n++
		}
		stale := cs[:n:n]
		cs = cs[n:]
		var c *conn
		if len(cs) > 0 {
			c = cs[len(cs)-1]
			cs[len(cs)-1] = nil
			cs = cs[:len(cs)-1]
			t.pool.addActiveLocked(c)
		}
		if n > 0 || c != nil {
			t.pool.idle[addr] = cs
		}
		t.pool.mu.Unlock()
		for _, s := range stale {
			s.nc.Close()
		}
		if c == nil {
			break
		}
		if probe || now.Sub(c.idleAt) > probeIdle {
			if !c.dl.IsZero() && !now.Before(c.dl) {
				// The deadline an earlier exchange left has passed: the peek would fail on
				// it and close a live connection.
				c.nc.SetDeadline(time.Time{})
				c.dl = time.Time{}
			}
		}
		if (probe || now.Sub(c.idleAt) > probeIdle) && !alive(c.nc) {
			t.pool.mu.Lock()
			t.pool.removeActiveLocked(c)
			t.pool.mu.Unlock()
			c.nc.Close()
			continue
		}
		c.reused = true
		c.awaitOK = now.Sub(c.idleAt) <= maxAwaitIdle
		c.takenAt = now
		return c, nil
	}
	return t.dial(a, addr)
}

func (t *Transport) dial(a *Attempt, addr string) (*conn, error) {
	ctx := a.Context
	if ctx == nil {
		ctx = context.Background()
	}
	var cancel context.CancelFunc
	if a.Deadline.IsZero() {
		ctx, cancel = context.WithCancel(ctx)
	} else {
		ctx, cancel = context.WithDeadline(ctx, a.Deadline)
	}
	defer cancel()
	dialled, ok := a.Dialling(cancel)
	if !ok {
		return nil, context.Canceled
	}
	nc, err := t.Dial(ctx, "tcp", addr)
	dialled()
	if err != nil {
		return nil, err
	}
	c := &conn{t: t, addr: addr, nc: nc, awaitOK: true}
	c.br = bufio.NewReaderSize(connIO{c}, readBufSize)
	if sc, ok := nc.(syscall.Conn); ok {
		c.rc, _ = sc.SyscallConn() // nil: writeAwait is not used
	}
	t.pool.mu.Lock()
	if t.pool.closed {
		t.pool.mu.Unlock()
		nc.Close()
		return nil, ErrClosed
	}
	t.pool.addActiveLocked(c)
	t.pool.mu.Unlock()
	return c, nil
}

// conn is one connection. It is owned by one exchange at a time: by the pool, or by the
// exchange that took it until its response body is finished.
type conn struct {
	t    *Transport
	addr string
	nc   net.Conn
	rc   syscall.RawConn // nc's, for writeAwait; nil if nc has none
	aw   awaiter
	// awaitOK: the exchange may use writeAwait. Not after the connection sat idle for more
	// than maxAwaitIdle: a server that half-closed it meanwhile (its FIN already here) would
	// leave the wait to its deadline, where a read finds the end of file at once and the
	// request is replayed on a new connection.
	awaitOK bool
	br      *bufio.Reader
	wbuf    []byte
	hbuf    []byte    // scratch for a response head
	idleAt  time.Time // when it entered the pool: when its last response head arrived
	takenAt time.Time // when the pool handed it to the current exchange (zero: dialled)
	reused  bool      // taken from the pool for the current exchange

	prev, next *conn       // ring of connections in use; guarded by pool.mu
	killed     atomic.Bool // Transport.Close aborted it

	// Per exchange.
	att       *Attempt
	closeWhen bool      // close after this exchange (Connection: close, HTTP/1.0, request Close)
	dl        time.Time // the deadline set on nc (zero: none); at most the exchange's own
}

// awaiter is a connection's state for writeAwait's callback, kept with it so that an
// exchange allocates no closure.
type awaiter struct {
	b       []byte
	a       *Attempt
	n       int
	err     error
	started bool
	fn      func(uintptr) bool // the callback, bound once
}

// staleError marks a failure on a reused connection before any response byte arrived: the
// server most likely closed it while it was idle. The request may be replayed once on a new
// connection.
type staleError struct {
	err            error
	nothingWritten bool
}

func (e *staleError) Error() string { return e.err.Error() }
func (e *staleError) Unwrap() error { return e.err }

func unwrapStale(err error) error {
	var se *staleError
	if errors.As(err, &se) {
		return se.err
	}
	return err
}

// roundTrip runs one exchange on c. On error c is closed.
func (c *conn) roundTrip(req *http.Request, a *Attempt) (*http.Response, error) {
	// The deadline first, then publish c to a: a Cancel from then on overrides it.
	if d := a.Deadline; keepDeadline(c.dl, d, c.takenAt) {
		// The connection's deadline stays (see keepDeadline): no timer to move.
	} else {
		c.nc.SetDeadline(d)
		c.dl = d
	}
	c.att = a
	c.closeWhen = req.Close
	if !a.Own(c.nc) {
		c.fail()
		return nil, wrap(a, "write request", context.Canceled, false)
	}

	w, err := c.writeRequest(req, a) // marks the attempt sent
	if err != nil {
		err = c.ioError("write request", err)
		c.fail()
		if c.reused && w == 0 && !isCtxErr(err) {
			return nil, &staleError{err: err, nothingWritten: true}
		}
		return nil, err
	}

	resp, at, nothingRead, err := c.readResponse(req)
	if err != nil {
		stale := c.reused && nothingRead && (err == errServerClosed || isReset(err))
		err = c.ioError("read response", err)
		c.fail()
		if stale && !isCtxErr(err) {
			return nil, &staleError{err: err}
		}
		return nil, err
	}
	a.MarkAnswered(at) // c may be back in the pool already (an empty body): not touched here
	return resp, nil
}

func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrClosed)
}

var aLongTimeAgo = time.Unix(1, 0)

// keepDeadline reports whether a connection whose deadline is dl may keep it for an exchange
// that must end by d, at now: dl is not after d (the exchange never outlives its own
// deadline) and leaves at least half of the exchange's time. An exchange still running at
// dl then moves the deadline to its own (conn.early) and goes on. Setting a connection's
// deadline moves a runtime timer, twice per exchange of a busy connection otherwise (its
// read and its write side); kept, a connection moves it about once per half a timeout.
func keepDeadline(dl, d, now time.Time) bool {
	if d.IsZero() || dl.IsZero() {
		return d.IsZero() && dl.IsZero()
	}
	return !dl.After(d) && dl.Sub(now) >= d.Sub(now)/2
}

// early reports whether err is the connection's deadline (c.dl) passing before the
// exchange's own, and if so moves it there: the failed read or write may be made again. Not
// after a Cancel or Transport.Close, whose deadline in the past must stay.
func (c *conn) early(err error) bool {
	a := c.att
	if a == nil || a.Deadline.IsZero() || c.dl.Equal(a.Deadline) || !errors.Is(err, os.ErrDeadlineExceeded) ||
		!time.Now().Before(a.Deadline) || c.killed.Load() {
		return false
	}
	if !a.Extend(c.nc) {
		return false // cancelled
	}
	if c.killed.Load() {
		// Transport.Close raced the extension (it marks killed before it sets the deadline
		// in the past): put its deadline back.
		c.nc.SetDeadline(aLongTimeAgo)
		return false
	}
	c.dl = a.Deadline
	return true
}

// connIO is a connection's reads and writes as the exchange makes them: a deadline of the
// connection's that passes before the exchange's own (conn.early) is moved, and the read or
// write goes on.
type connIO struct{ c *conn }

func (r connIO) Read(p []byte) (int, error) {
	for {
		n, err := r.c.nc.Read(p)
		if n > 0 || err == nil || !r.c.early(err) {
			return n, err
		}
	}
}

func (r connIO) Write(p []byte) (int, error) {
	w := 0
	for {
		n, err := r.c.nc.Write(p[w:])
		w += n
		if err == nil || !r.c.early(err) {
			return w, err
		}
	}
}

// ioError is the error the exchange on c reports for err.
func (c *conn) ioError(op string, err error) error {
	return wrap(c.att, op, err, c.killed.Load())
}

type opError struct {
	op  string
	err error
}

func (e *opError) Error() string { return "h1: " + e.op + ": " + e.err.Error() }
func (e *opError) Unwrap() error { return e.err }

// fail ends the exchange after an error: c is closed, never reused.
func (c *conn) fail() { c.release(false) }

// finish ends the exchange after the response was read to its end: c goes back to the pool
// if it is clean (nothing unread, no close asked for, not cancelled).
func (c *conn) finish() { c.release(true) }

func (c *conn) release(reusable bool) {
	if c.att.Disown() {
		reusable = false // cancelled: the deadline may be in the past
	}
	c.att = nil
	reusable = reusable && !c.closeWhen && c.br.Buffered() == 0
	if reusable && cap(c.wbuf) > maxKeptWrite {
		c.wbuf = nil
	}
	p := &c.t.pool
	p.mu.Lock()
	p.removeActiveLocked(c)
	if reusable && !p.closed && !c.killed.Load() {
		if cs := p.idle[c.addr]; len(cs) < c.t.MaxIdleConnsPerHost {
			c.reused, c.takenAt = false, time.Time{}
			p.idle[c.addr] = append(cs, c)
			p.mu.Unlock()
			return
		}
	}
	p.mu.Unlock()
	c.nc.Close()
}

// writeRequest writes req in one system call when its body is small, and marks a sent. It
// returns the number of bytes the connection accepted.
func (c *conn) writeRequest(req *http.Request, a *Attempt) (int, error) {
	b, body, err := appendRequest(c.wbuf[:0], req, maxKeptWrite)
	if err != nil {
		return 0, err
	}
	cl := req.ContentLength
	c.wbuf = b
	// From here on the request may have reached the network.
	a.MarkWrote()
	if a.RequestContext != nil {
		if trace := httptrace.ContextClientTrace(a.RequestContext); trace != nil && trace.WroteHeaders != nil {
			trace.WroteHeaders()
		}
	}
	if body == nil && c.rc != nil && c.awaitOK {
		w, ok, err := writeAwait(c.rc, &c.aw, b, a) // marks a sent
		if ok || err != nil {
			return w, err
		}
		// The rest did not fit in the socket's buffer (or the wait could not start: the
		// deadline passed): Write waits for room, or fails.
		n, err := connIO{c}.Write(b[w:])
		if err == nil {
			a.MarkSent(time.Now())
		}
		return w + n, err
	}
	w, err := connIO{c}.Write(b)
	if err == nil && body == nil {
		a.MarkSent(time.Now())
	}
	if err != nil || body == nil {
		if body != nil {
			body.Close()
		}
		return w, err
	}
	n, err := io.Copy(connIO{c}, io.LimitReader(body, cl))
	if err == nil && n < cl {
		err = errors.New("h1: request body shorter than ContentLength")
	}
	if err == nil {
		err = checkBodyEnd(body)
	} else {
		body.Close()
	}
	if err == nil {
		a.MarkSent(time.Now())
	}
	return w + int(n), err
}

// appendRequest appends req's head to b, and its body when the body is at most inline
// bytes long; otherwise it returns the body, still to be sent. On error the body is closed.
func appendRequest(b []byte, req *http.Request, inline int64) ([]byte, io.ReadCloser, error) {
	b, err := appendRequestHead(b, req)
	if err != nil {
		closeBody(req)
		return b, nil, err
	}
	var body io.ReadCloser
	if req.Body != nil && req.Body != http.NoBody {
		body = req.Body
	}
	cl := req.ContentLength
	if body != nil && cl <= inline {
		n := len(b)
		b = slices.Grow(b, int(cl))[:n+int(cl)]
		if _, err := io.ReadFull(body, b[n:]); err != nil {
			body.Close()
			return b, nil, errors.New("h1: request body shorter than ContentLength")
		}
		if err := checkBodyEnd(body); err != nil {
			return b, nil, err
		}
		body = nil
	}
	return b, body, nil
}

// checkBodyEnd closes body after checking it has no bytes beyond ContentLength.
func checkBodyEnd(body io.ReadCloser) error {
	var one [1]byte
	n, _ := body.Read(one[:])
	body.Close()
	if n > 0 {
		return errors.New("h1: request body longer than ContentLength")
	}
	return nil
}

// alive reports whether an idle connection is still open, with a non-blocking peek: no byte
// and no end-of-file may be pending on an idle HTTP/1.1 connection.
func alive(nc net.Conn) bool {
	ok, checked := peekIdle(nc)
	return ok || !checked
}

// isReset reports a connection reset or a broken pipe.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
