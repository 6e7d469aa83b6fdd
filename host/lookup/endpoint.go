package lookup

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/attempt"
	"github.com/clink-wasm/clink-wasm/host/lookup/internal/h1"
	"github.com/clink-wasm/clink-wasm/host/lookup/internal/h2"
	"github.com/sony/gobreaker/v2"
)

// Response is the outcome of a lookup. Exactly one of Status and Err is set: a response of
// any status, including 4xx and 5xx after retries, is a Response with that Status; Err is
// an *Error when no usable response arrived.
//
// Body is shared between requests that were served by one upstream call (single-flight) or
// from the cache: it must not be modified.
type Response struct {
	Status int
	Body   []byte
	Err    error
}

// Endpoint is one opened endpoint of one pipeline. Its methods are safe for concurrent use.
type Endpoint struct {
	name     string
	tenant   string
	cfg      EndpointConfig // defaulted and validated; never exposes injected secrets
	base     *url.URL
	root     string // escaped base path without trailing slash, "" for none
	prefix   string
	allowed  [len(methods)]bool
	inject   http.Header     // injected headers with secrets expanded; read-only
	injected map[string]bool // their canonical names
	sfAll    bool
	sfSafe   bool

	timeout       time.Duration
	maxBody       int64
	attempts      int
	backoff0      time.Duration
	backoffMax    time.Duration
	multiplier    float64
	jitter        float64
	retryStatus   statusSet
	retryTimeout  bool
	retryUnavail  bool
	retryUnsafe   bool
	breakerStatus statusSet

	transport *http.Transport // net/http's: the "std" transport, and h1's fallback
	h1        *h1.Transport   // the lean transport; nil unless configured (http:// only)
	async     asyncTransport  // "h2c" (*h2.Transport); nil unless configured (http://)
	breaker   *sharedBreaker  // nil when disabled
	limiter   *limiter
	cache     *cache // nil when disabled
	registry  *Registry
	log       *slog.Logger // with the tenant and endpoint name

	ctx    context.Context // cancelled by Close; parent of every call's context
	cancel context.CancelFunc

	flightMu sync.Mutex
	flights  map[string]*call // guarded by flightMu

	closeMu sync.RWMutex
	closed  bool           // guarded by closeMu
	live    sync.WaitGroup // calls not yet finished; Add under closeMu.RLock

	m counters
}

// asyncTransport runs exchanges without a goroutine each and calls back when they end:
// *h2.Transport ("h2c").
type asyncTransport interface {
	Handles(req *http.Request) bool
	Start(req *http.Request, a *attempt.Attempt, done func(*http.Response, error))
	Close()
}

func newEndpoint(tenant string, cfg *EndpointConfig, r *Registry) (*Endpoint, error) {
	base, err := cfg.parseBase()
	if err != nil {
		return nil, err
	}
	inject, names, err := injectedHeaders(cfg)
	if err != nil {
		return nil, err
	}
	policy, _ := cfg.Egress.compile() // validated
	retrySt, _ := parseStatusSet(cfg.Retry.Statuses)
	breakerSt, _ := parseStatusSet(cfg.Breaker.FailureStatuses)
	e := &Endpoint{
		name: cfg.Name, tenant: tenant, cfg: *cfg, base: base,
		root: base.RawPath, prefix: cfg.PathPrefix, allowed: methodSet(cfg.Methods),
		inject: inject, injected: names,
		sfAll: cfg.SingleFlight == "all", sfSafe: cfg.SingleFlight != "off",
		timeout: time.Duration(cfg.Timeout), maxBody: cfg.MaxResponseBytes,
		attempts: cfg.Retry.MaxAttempts, backoff0: time.Duration(cfg.Retry.InitialBackoff),
		backoffMax: time.Duration(cfg.Retry.MaxBackoff), multiplier: cfg.Retry.Multiplier,
		jitter: *cfg.Retry.Jitter, retryStatus: retrySt, retryUnsafe: cfg.Retry.RetryNonIdempotent,
		breakerStatus: breakerSt, registry: r, flights: make(map[string]*call),
		log: r.log.With("tenant", tenant, "endpoint", cfg.Name),
	}
	for _, k := range cfg.Retry.On {
		e.retryTimeout = e.retryTimeout || k == KindTimeout.String()
		e.retryUnavail = e.retryUnavail || k == KindUnavailable.String()
	}
	dial := r.dial
	if dial == nil {
		d := &net.Dialer{Timeout: e.timeout, KeepAlive: 30 * time.Second, Control: policy.controlCheck}
		dial = d.DialContext
	}
	g := &guardedDialer{policy: policy, resolve: r.resolve, dial: dial}
	e.transport = &http.Transport{
		Proxy:                  nil, // never: an environment proxy would bypass the egress policy
		DialContext:            g.DialContext,
		MaxIdleConns:           0,
		MaxIdleConnsPerHost:    cfg.MaxInFlight,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    e.timeout,
		ForceAttemptHTTP2:      true,
		MaxResponseHeaderBytes: 64 << 10,
	}
	e.limiter = newLimiter(cfg)
	if cfg.Cache != nil {
		e.cache = newCache(cfg.Cache)
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	tr := cfg.Transport
	if tr == "h2c" && base.Scheme == "http" {
		// Prior knowledge: every request is HTTP/2, those the lean client does not take
		// (bodies of unknown length, Expect) too, through net/http.
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		e.transport.Protocols = &p
		e.async = &h2.Transport{
			Dial:                   g.DialContext, // the egress checks run before every connect
			Context:                e.ctx,
			MaxResponseHeaderBytes: int(e.transport.MaxResponseHeaderBytes),
			MaxBodyBytes:           e.maxBody,
			IdleConnTimeout:        e.transport.IdleConnTimeout,
			Sensitive:              names, // injected headers carry credentials: never HPACK-indexed
		}
	}
	if tr == "h1" && base.Scheme == "http" {
		e.h1 = &h1.Transport{
			Dial:                   g.DialContext, // the egress checks run before every connect
			Fallback:               e.transport,
			MaxIdleConnsPerHost:    cfg.MaxInFlight,
			IdleConnTimeout:        e.transport.IdleConnTimeout,
			MaxResponseHeaderBytes: int(e.transport.MaxResponseHeaderBytes),
			MaxBodyBytes:           e.maxBody,
		}
	}
	return e, nil
}

// Name returns the endpoint's name.
func (e *Endpoint) Name() string { return e.name }

// Config returns the endpoint's defaulted configuration (secret references unexpanded).
func (e *Endpoint) Config() EndpointConfig { return cloneConfig(e.cfg) }

// Close cancels every pending request (their done callbacks report KindCancelled), waits until
// the done callback of every request started before it has been called (except those whose
// own context ended, which are reported as it ends), and releases the endpoint's connections and its share
// of the breaker. Do after Close reports KindCancelled.
func (e *Endpoint) Close() error {
	e.closeMu.Lock()
	if e.closed {
		e.closeMu.Unlock()
		return nil
	}
	e.closed = true
	e.closeMu.Unlock()
	e.cancel()
	if e.h1 != nil {
		e.h1.Close() // aborts exchanges on the wire, as the cancelled context does for net/http
	}
	if e.async != nil {
		e.async.Close() // fails the exchanges on the wire and stops the connections
	}
	e.limiter.close()
	e.live.Wait()
	e.transport.CloseIdleConnections()
	if e.breaker != nil {
		e.registry.releaseBreaker(e.breaker)
	}
	return nil
}

// Do starts req and returns at once; done is called exactly once, from another goroutine,
// with the response or a typed error (see [Response], [Kind]). Do never calls done before it
// returns, so done may take locks the caller holds around Do. With transport "h2c" done
// usually runs on a connection's reader goroutine, which serves every stream of the
// connection: it must not block.
//
// Before anything is sent the request passes, in order: policy (method, headers, path),
// the response cache, single-flight (joining an identical call in flight), the circuit
// breaker, and the concurrency limiter, whose queue holds no goroutine. Retries wait on
// timers. Cancelling ctx abandons the request (KindCancelled, or KindTimeout for a deadline);
// the upstream call itself is cancelled once no request is waiting for it.
func (e *Endpoint) Do(ctx context.Context, req Request, done func(Response)) {
	start := time.Now()
	e.m.requests.Add(1)
	e.closeMu.RLock()
	if e.closed {
		e.closeMu.RUnlock()
		e.deliverAsync(done, start, Response{Err: &Error{Kind: KindCancelled, Reason: "endpoint closed", notSent: true}}, false)
		return
	}
	e.live.Add(1) // for a possible new call; given back below if none is made
	e.closeMu.RUnlock()
	made := false
	defer func() {
		if !made {
			e.live.Done()
		}
	}()

	if err := ctx.Err(); err != nil {
		e.deliverAsync(done, start, Response{Err: ctxError(err)}, true)
		return
	}
	c, rerr := e.prepare(req)
	if rerr != nil {
		e.deliverAsync(done, start, Response{Err: rerr}, true)
		return
	}
	if c.cacheable {
		if r, ok := e.cache.get(c.key); ok {
			e.m.cacheHits.Add(1)
			e.deliverAsync(done, start, r, true)
			return
		}
		e.m.cacheMisses.Add(1)
	}
	// The creator is a waiter before the call is published, so that a joiner that leaves
	// at once cannot abandon the call under it.
	c.first = waiter{done: done, start: start}
	c.one[0] = &c.first
	c.waiters = c.one[:1]
	if c.shared {
		e.flightMu.Lock()
		if f := e.flights[c.key]; f != nil {
			w := &waiter{done: done, start: start}
			if f.join(ctx, w) {
				e.flightMu.Unlock()
				e.m.shared.Add(1)
				return
			}
		}
		e.flights[c.key] = c
		e.flightMu.Unlock()
	}
	made = true
	c.watch(ctx, &c.first)
	c.next(false)
}

// DoRaw is Do for a request in the guest's bytes (docs/abi.md, "Lookup request format"): a
// malformed one is refused by rule RuleRequestFormat, counted and logged like every other
// refusal, and reported to done (never before DoRaw returns).
func (e *Endpoint) DoRaw(ctx context.Context, raw []byte, done func(Response)) {
	req, err := ParseRequest(raw)
	if err != nil {
		e.m.requests.Add(1)
		e.deliverAsync(done, time.Now(), Response{Err: err}, false)
		return
	}
	e.Do(ctx, req, done)
}

// waiter is one Do waiting on a call.
type waiter struct {
	done  func(Response)
	start time.Time
	stop  func() bool // stops the AfterFunc on the waiter's context; nil if none
}

// call is one upstream request with its retries, shared by every waiter that joined it.
//
// Lifecycle: next (breaker, limiter) → queued or send → attemptDone → next after a backoff
// timer, or finish. Exactly one goroutine at a time drives a call; the states below tell
// stop what it may take over.
type call struct {
	e          *Endpoint
	method     string
	url        url.URL
	header     http.Header
	body       []byte
	key        string // single-flight and cache key; "" when neither applies
	shared     bool
	cacheable  bool
	idempotent bool

	first waiter     // the waiter that created the call, to save an allocation
	one   [1]*waiter // backing array of waiters for the common single waiter

	mu        sync.Mutex
	state     callState          // guarded by mu
	waiters   []*waiter          // guarded by mu
	abandoned bool               // the last waiter left; guarded by mu
	abort     context.CancelFunc // cancels a net/http attempt on the wire; guarded by mu
	viaH1     bool               // the attempt on the wire is c.att's; guarded by mu
	att       attempt.Attempt    // deadline and cancellation of an attempt over h1 or h2c
	hreq      http.Request       // the request of an attempt over h1 (net/http gets its own)
	timer     *time.Timer        // backoff timer; guarded by mu
	closeStop func() bool        // stops the Close hook of a call in backoff; guarded by mu
	attempts  int                // attempts started; written only by the driving goroutine
	last      Response           // last attempt's outcome, for a breaker rejection mid-retry
	bdone     func(err error)    // breaker completion of the current attempt

	// An attempt over an asynchronous transport (sendAsync); written by the driving side.
	asyncT0   time.Time
	asyncReq  *http.Request   // the exchange on the wire: the request or a redirect
	asyncVia  []*http.Request // redirects followed
	asyncDone func(*http.Response, error)

	// Limiter queue linkage and probe epoch; guarded by limiter.mu.
	qprev, qnext *call
	qAt          time.Time
	queued       bool
	epoch        uint64
}

type callState uint8

const (
	stateStarting callState = iota // between next and acquire
	stateQueued                    // in the limiter queue
	stateSending                   // an attempt is on the wire
	stateBackoff                   // waiting on c.timer
	stateDone
)

// prepare applies the endpoint's policy to req and builds the call.
func (e *Endpoint) prepare(req Request) (*call, *Error) {
	mi := methodIndex(req.Method)
	if mi < 0 || !e.allowed[mi] {
		return nil, refused(RuleMethods, "method "+req.Method+" not allowed")
	}
	escaped, query, err := resolvePath(e.root, e.prefix, req.Path)
	if err != nil {
		var le *Error
		errors.As(err, &le)
		return nil, le
	}
	c := &call{e: e, method: req.Method, body: req.Body, idempotent: idempotent(req.Method)}
	c.url = *e.base
	c.url.RawPath = escaped
	c.url.Path = escaped
	if strings.IndexByte(escaped, '%') >= 0 {
		c.url.Path, _ = url.PathUnescape(escaped) // validated by resolvePath
	}
	c.url.RawQuery = query
	if len(req.Header) == 0 {
		c.header = e.inject // shared and read-only: net/http does not modify request headers
	} else {
		c.header = make(http.Header, len(req.Header)+len(e.inject))
		for k, v := range e.inject {
			c.header[k] = v
		}
		for _, h := range req.Header {
			if !validHeader(h) {
				return nil, refused(RuleHeaders, "malformed header")
			}
			k := textproto.CanonicalMIMEHeaderKey(h.Name)
			if forbiddenHeaders[k] || e.injected[k] {
				return nil, refused(RuleHeaders, "header "+k+" may not be set")
			}
			c.header[k] = append(c.header[k], h.Value)
		}
	}
	c.shared = e.sfAll || (e.sfSafe && safe(req.Method))
	c.cacheable = e.cache != nil && e.cache.cacheable(req.Method)
	if c.shared || c.cacheable {
		c.key = requestKey(req, escaped, query)
	}
	return c, nil
}

// validHeader re-checks a header of a Request built from Go rather than ParseRequest.
func validHeader(h HeaderField) bool {
	if h.Name == "" {
		return false
	}
	for i := 0; i < len(h.Name); i++ {
		if !isTokenChar(h.Name[i]) {
			return false
		}
	}
	for i := 0; i < len(h.Value); i++ {
		if c := h.Value[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// requestKey identifies a request for single-flight and the cache: the normalised path, so
// that "/a/../b" and "/b" share, plus method, guest headers in order, and body.
func requestKey(req Request, escaped, query string) string {
	n := len(req.Method) + len(escaped) + len(query) + len(req.Body) + 4
	for _, h := range req.Header {
		n += len(h.Name) + len(h.Value) + 2
	}
	b := make([]byte, 0, n)
	b = append(b, req.Method...)
	b = append(b, ' ')
	b = append(b, escaped...)
	b = append(b, '?')
	b = append(b, query...)
	b = append(b, '\n')
	for _, h := range req.Header {
		b = append(b, strings.ToLower(h.Name)...)
		b = append(b, ':')
		b = append(b, h.Value...)
		b = append(b, '\n')
	}
	b = append(b, '\n')
	b = append(b, req.Body...)
	return string(b)
}

// join adds w to a shared call in flight. It reports false if c is finished or abandoned by
// its last waiter; the caller then starts a new call. The caller holds e.flightMu.
func (c *call) join(ctx context.Context, w *waiter) bool {
	c.mu.Lock()
	if c.state == stateDone || c.abandoned {
		c.mu.Unlock()
		return false
	}
	c.waiters = append(c.waiters, w)
	c.mu.Unlock()
	c.watch(ctx, w)
	return true
}

func (c *call) watch(ctx context.Context, w *waiter) {
	if ctx.Done() != nil {
		w.stop = context.AfterFunc(ctx, func() { c.leave(w, ctx.Err()) })
	}
}

// leave removes w after its context ended and reports that to it. The last waiter to leave
// cancels the upstream call.
func (c *call) leave(w *waiter, cause error) {
	c.mu.Lock()
	i := -1
	for j, x := range c.waiters {
		if x == w {
			i = j
			break
		}
	}
	if i < 0 {
		c.mu.Unlock()
		return // already delivered by finish
	}
	c.waiters = append(c.waiters[:i], c.waiters[i+1:]...)
	last := len(c.waiters) == 0
	if last {
		c.abandoned = true // no new waiter may join a call about to be cancelled
	}
	c.mu.Unlock()
	c.e.deliver(w, Response{Err: ctxError(cause)})
	if last {
		c.forget()
		c.stop()
	}
}

// forget removes c from the single-flight table so that no new request joins it.
func (c *call) forget() {
	if !c.shared {
		return
	}
	c.e.flightMu.Lock()
	if c.e.flights[c.key] == c {
		delete(c.e.flights, c.key)
	}
	c.e.flightMu.Unlock()
}

// stop ends the call early, after its last waiter left or when the endpoint closes: it
// cancels an attempt on the wire (which then finishes the call itself), or takes the call
// out of the limiter queue or its backoff timer and finishes it.
func (c *call) stop() {
	c.mu.Lock()
	switch c.state {
	case stateSending:
		if c.viaH1 {
			c.att.Cancel()
		} else if c.abort != nil {
			c.abort()
		}
	case stateBackoff:
		if c.timer.Stop() {
			c.state = stateStarting // owned by us now
			c.mu.Unlock()
			c.finish(Response{Err: c.cancelError()})
			return
		}
	case stateQueued:
		if c.e.limiter.remove(c) {
			c.mu.Unlock()
			c.breakerDone(errExcluded)
			c.finish(Response{Err: c.cancelError()})
			return
		}
	}
	c.mu.Unlock()
}

// cancelled reports whether the call should stop: abandoned, or the endpoint closed.
func (c *call) cancelled() bool {
	c.mu.Lock()
	ab := c.abandoned
	c.mu.Unlock()
	return ab || c.e.ctx.Err() != nil
}

func (c *call) cancelError() *Error {
	if c.e.ctx.Err() != nil {
		return &Error{Kind: KindCancelled, Reason: "endpoint closed", notSent: true}
	}
	return &Error{Kind: KindCancelled, Reason: "no request is waiting", notSent: true}
}

// next starts an attempt: breaker, then limiter. inline says whether the current goroutine
// may carry the attempt (a timer goroutine may; the caller of Do may not).
func (c *call) next(inline bool) {
	c.mu.Lock()
	closeStop := c.closeStop
	c.closeStop = nil
	c.mu.Unlock()
	if closeStop != nil {
		closeStop()
	}
	if c.cancelled() {
		c.finishFrom(Response{Err: c.cancelError()}, !inline)
		return
	}
	e := c.e
	if e.breaker != nil {
		done, err := e.breaker.cb.Allow()
		if err != nil {
			if c.attempts == 0 {
				reason := "open"
				if errors.Is(err, gobreaker.ErrTooManyRequests) {
					reason = "half-open, probe in flight"
				}
				c.finishFrom(Response{Err: &Error{Kind: KindBreakerOpen, Reason: reason, Err: err, notSent: true}}, !inline)
			} else {
				c.finishFrom(c.last, !inline) // the breaker opened during our retries: report what we saw
			}
			return
		}
		c.bdone = done
	}
	c.mu.Lock()
	c.state = stateQueued
	c.mu.Unlock()
	ok, err := e.limiter.acquire(c)
	switch {
	case err != nil:
		c.breakerDone(errExcluded)
		c.finishFrom(Response{Err: err}, !inline)
	case ok && (inline || c.asyncRequest() != nil):
		c.send() // an asynchronous transport's send does not block
	case ok:
		go c.send()
	case c.cancelled() && e.limiter.remove(c):
		// Cancelled between setting stateQueued and queueing, when stop could not
		// find it in the queue yet.
		c.breakerDone(errExcluded)
		c.finishFrom(Response{Err: c.cancelError()}, !inline)
	}
	// else: queued; the limiter starts c.send or calls c.attemptFailed.
}

func (c *call) breakerDone(err error) {
	if c.bdone != nil {
		c.bdone(err)
		c.bdone = nil
	}
}

// send runs c's attempt and then, while the limiter hands over queued calls, theirs: one
// goroutine serves a chain of attempts instead of one goroutine each.
func (c *call) send() {
	for c != nil {
		c = c.sendOne()
	}
}

func (c *call) sendOne() (next *call) {
	e := c.e
	c.attempts++
	e.m.attempts.Add(1)
	if c.attempts > 1 {
		e.m.retries.Add(1)
	}
	t0 := time.Now()
	if hreq := c.asyncRequest(); hreq != nil {
		c.sendAsync(hreq, t0)
		return nil // the completion ends the attempt and starts the next queued call
	}
	if hreq := c.h1Request(); hreq != nil {
		// The lean transport: the attempt's deadline is its connection's deadline and stop
		// cancels it through c.att, so the attempt needs no context and no timer.
		c.att.Reset(t0.Add(e.timeout))
		c.att.Context = e.ctx // bounds a dial; Close aborts exchanges through h1.Close
		c.mu.Lock()
		c.state = stateSending
		c.viaH1 = true
		abandoned := c.abandoned
		c.mu.Unlock()
		if abandoned {
			c.att.Cancel()
		}
		resp, err := e.follow(hreq, func(req *http.Request) (*http.Response, error) { return e.h1.Exchange(req, &c.att) })
		return c.attemptEnd(t0, resp, err)
	}
	// net/http: the attempt's context derives from the endpoint's, so Close cancels it;
	// stop cancels it through c.abort.
	actx, cancel := context.WithTimeout(e.ctx, e.timeout)
	c.mu.Lock()
	c.state = stateSending
	c.abort = cancel
	abandoned := c.abandoned
	c.mu.Unlock()
	if abandoned {
		cancel()
	}
	var wroteFlag atomic.Bool
	var sentAt, answeredAt atomic.Int64 // unix ns; set on net/http's goroutines
	adaptive := e.limiter.algorithm != "fixed"
	if (!c.idempotent && !e.retryUnsafe) || adaptive {
		trace := &httptrace.ClientTrace{
			WroteHeaderField: func(string, []string) { wroteFlag.Store(true) },
			WroteHeaders:     func() { wroteFlag.Store(true) },
		}
		if adaptive {
			trace.WroteRequest = func(httptrace.WroteRequestInfo) { sentAt.Store(time.Now().UnixNano()) }
			trace.GotFirstResponseByte = func() { answeredAt.Store(time.Now().UnixNano()) }
		}
		actx = httptrace.WithClientTrace(actx, trace)
	}
	resp, err := e.follow(c.newRequest(actx), e.transport.RoundTrip)
	var r Response
	if err == nil {
		r.Status = resp.StatusCode
		r.Body, err = e.readBody(resp, c.method)
		resp.Body.Close()
	}
	timedOut, wrote := errors.Is(actx.Err(), context.DeadlineExceeded), wroteFlag.Load()
	cancel()
	c.mu.Lock()
	c.abort = nil
	c.mu.Unlock()
	if err != nil {
		r = Response{Err: c.classify(err, timedOut, wrote)}
	}
	c.att.Reset(time.Time{})
	if s, a := sentAt.Load(), answeredAt.Load(); s != 0 && a != 0 {
		c.att.MarkSent(time.Unix(0, s))
		c.att.MarkAnswered(time.Unix(0, a))
	}
	return c.outcome(t0, r, resp)
}

// sendAsync runs the attempt over the asynchronous transport: hreq, then the redirects it
// follows, each started from the completion of the previous one. The last completion ends
// the attempt and starts the call the limiter hands over, on the completing goroutine if it
// goes over the asynchronous transport too.
func (c *call) sendAsync(hreq *http.Request, t0 time.Time) {
	e := c.e
	c.att.Reset(t0.Add(e.timeout))
	c.mu.Lock()
	c.state = stateSending
	c.viaH1 = true
	abandoned := c.abandoned
	c.mu.Unlock()
	if abandoned {
		c.att.Cancel()
	}
	c.asyncT0, c.asyncReq, c.asyncVia = t0, hreq, c.asyncVia[:0]
	if c.asyncDone == nil {
		c.asyncDone = c.asyncExchanged // one method value per call, not per attempt
	}
	e.async.Start(hreq, &c.att, c.asyncDone)
}

// asyncExchanged is the completion of an exchange started by sendAsync: it follows a
// redirect with another exchange, or ends the attempt.
func (c *call) asyncExchanged(resp *http.Response, err error) {
	e := c.e
	if err == nil {
		var next *http.Request
		if next, err = e.redirect(c.asyncReq, resp, &c.asyncVia); next != nil {
			c.asyncReq = next
			e.async.Start(next, &c.att, c.asyncDone)
			return
		}
		if err != nil {
			resp = nil
		}
	}
	c.asyncReq = nil
	if next := c.attemptEnd(c.asyncT0, resp, err); next != nil {
		if next.asyncRequest() != nil {
			next.send()
		} else {
			go next.send() // net/http blocks: not on the transport's goroutine
		}
	}
}

// attemptEnd ends an attempt over h1 or h2c (c.att): reads the body, classifies the
// outcome, and hands it to outcome.
func (c *call) attemptEnd(t0 time.Time, resp *http.Response, err error) (next *call) {
	var r Response
	if err == nil {
		r.Status = resp.StatusCode
		r.Body, err = c.e.readBody(resp, c.method)
		resp.Body.Close()
	}
	if err != nil {
		r = Response{Err: c.classify(err, !time.Now().Before(c.att.Deadline), c.att.Wrote())}
	}
	c.mu.Lock()
	c.viaH1 = false
	c.mu.Unlock()
	return c.outcome(t0, r, resp)
}

// outcome accounts an attempt's result r (to the metrics, limiter and breaker) and retries
// or finishes the call. It returns the queued call the limiter handed over, if any.
func (c *call) outcome(t0 time.Time, r Response, resp *http.Response) (next *call) {
	e := c.e
	rtt := time.Since(t0)
	// The controller steers by the upstream's share: from the request's last write to its
	// response head (c.att, recorded by the transport). The rest of the attempt (a slot's
	// hand-over, a goroutine's start, a dial, reading the body, the client's own run queue
	// before and after) is the client's queueing, which grows when the client is busy and
	// which a lower limit would not cure: read as upstream latency, it made the default
	// limiter throttle a busy client (issue 11).
	lat := rtt
	if up, ok := c.att.Upstream(); ok {
		lat = up
	}

	kind := Kind(r.Err)
	if r.Err == nil || kind == KindTimeout || kind == KindTooLarge {
		e.m.upstream.record(rtt)
	}
	next = e.limiter.release(sample{
		rtt:      lat,
		valid:    r.Err == nil || kind == KindTimeout || kind == KindUnavailable,
		noRTT:    kind == KindUnavailable, // a refused connection is fast and says nothing of latency
		overload: kind != KindNone && kind != KindTooLarge || r.Status == http.StatusTooManyRequests || r.Status == http.StatusServiceUnavailable,
		epoch:    c.epoch,
	})

	switch {
	case kind == KindTimeout || kind == KindUnavailable || (r.Err == nil && e.breakerStatus.has(r.Status)):
		c.breakerDone(errBreakerFailure)
	case r.Err == nil:
		c.breakerDone(nil)
	default:
		c.breakerDone(errExcluded)
	}
	var retryAfter time.Duration
	if r.Err == nil && e.retryStatus.has(r.Status) {
		retryAfter = parseRetryAfter(resp.Header.Get("Retry-After"))
	}
	c.attemptDone(r, retryAfter)
	return next
}

// asyncRequest is h1Request for the asynchronous transport ("h2c").
func (c *call) asyncRequest() *http.Request {
	if c.e.async == nil {
		return nil
	}
	return c.requestFor(c.e.async)
}

// h1Request returns the attempt's request for the lean transport, or nil if the endpoint
// does not use it or the request needs what only net/http does (Expect, for one).
func (c *call) h1Request() *http.Request {
	if c.e.h1 == nil {
		return nil
	}
	return c.requestFor(c.e.h1)
}

// requestFor returns c.hreq, rebuilt in place for the next attempt (no allocation without
// a body), if t handles it; nil if the request must go to net/http.
func (c *call) requestFor(t interface{ Handles(*http.Request) bool }) *http.Request {
	c.fillRequest(&c.hreq)
	if !t.Handles(&c.hreq) {
		return nil
	}
	return &c.hreq
}

// newRequest is a new request for net/http, which keeps it beyond the attempt.
func (c *call) newRequest(ctx context.Context) *http.Request {
	r := new(http.Request)
	c.fillRequest(r)
	return r.WithContext(ctx)
}

// fillRequest sets *r to the call's request, with a fresh reader over its body.
func (c *call) fillRequest(r *http.Request) {
	*r = http.Request{
		Method:     c.method,
		URL:        &c.url,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     c.header,
		Host:       c.url.Host,
	}
	if len(c.body) > 0 {
		body := c.body
		r.ContentLength = int64(len(body))
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
}

// readBody reads the whole body, failing as soon as it exceeds the endpoint's limit.
func (e *Endpoint) readBody(resp *http.Response, method string) ([]byte, error) {
	if method == http.MethodHead || resp.Body == http.NoBody {
		return nil, nil
	}
	tooLarge := func() error {
		return &Error{Kind: KindTooLarge, Reason: "response exceeds max_response_bytes (" + strconv.FormatInt(e.maxBody, 10) + ")"}
	}
	if resp.ContentLength > e.maxBody {
		return nil, tooLarge()
	}
	if mb, ok := resp.Body.(interface{ Bytes() []byte }); ok {
		// The transport read the body already, within the limit (h2): take it as it is.
		if b := mb.Bytes(); int64(len(b)) <= e.maxBody {
			return b, nil
		}
		return nil, tooLarge()
	}
	if resp.ContentLength >= 0 {
		b := make([]byte, resp.ContentLength)
		if _, err := io.ReadFull(resp.Body, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(resp.Body, e.maxBody+1))
	if err != nil {
		return nil, err
	}
	if n > e.maxBody {
		return nil, tooLarge()
	}
	return buf.Bytes(), nil
}

// classify turns a transport error into an *Error. timedOut says whether the attempt's
// deadline has passed; wrote whether any byte of the request may have been sent.
func (c *call) classify(err error, timedOut, wrote bool) *Error {
	if errors.Is(err, h2.ErrRefused) {
		// Not processed by the server (REFUSED_STREAM, or above a GOAWAY's last stream):
		// safe to retry whatever the method.
		return &Error{Kind: KindUnavailable, Err: err, notSent: true}
	}
	if errors.Is(err, attempt.ErrBodyTooLarge) {
		return &Error{Kind: KindTooLarge, Reason: "response exceeds max_response_bytes (" + strconv.FormatInt(c.e.maxBody, 10) + ")"}
	}
	var le *Error
	if errors.As(err, &le) {
		if le.Kind == KindUnavailable && timedOut {
			return &Error{Kind: KindTimeout, Reason: "connect exceeded timeout", Err: err, notSent: le.notSent}
		}
		return le
	}
	if c.cancelled() {
		return c.cancelError()
	}
	if timedOut || errors.Is(err, context.DeadlineExceeded) {
		return &Error{Kind: KindTimeout, Reason: "attempt exceeded timeout (" + c.e.timeout.String() + ")", Err: err, notSent: !wrote && !c.idempotent && !c.e.retryUnsafe}
	}
	return &Error{Kind: KindUnavailable, Err: err, notSent: !wrote && !c.idempotent && !c.e.retryUnsafe}
}

// attemptFailed ends an attempt that never got a slot (queue expiry, Close).
func (c *call) attemptFailed(err *Error, _ bool) {
	c.breakerDone(errExcluded)
	c.finish(Response{Err: err})
}

// attemptDone retries r after a backoff if the policy allows, else finishes with it.
func (c *call) attemptDone(r Response, retryAfter time.Duration) {
	e := c.e
	if c.cancelled() {
		c.finish(Response{Err: c.cancelError()})
		return
	}
	if !e.shouldRetry(c, r) {
		c.finish(r)
		return
	}
	d := e.backoff(c.attempts)
	if retryAfter > 0 {
		if retryAfter > e.backoffMax {
			c.finish(r) // the upstream asks for longer than we may wait
			return
		}
		d = max(d, retryAfter)
	}
	c.last = r
	c.mu.Lock()
	c.state = stateBackoff
	// The timer, not a sleeping goroutine, carries the call until the retry; a hook on the
	// endpoint's context ends the wait if the endpoint closes.
	c.timer = time.AfterFunc(d, func() { c.next(true) })
	c.closeStop = context.AfterFunc(e.ctx, c.stop)
	c.mu.Unlock()
}

func (e *Endpoint) shouldRetry(c *call, r Response) bool {
	if c.attempts >= e.attempts {
		return false
	}
	if r.Err == nil {
		return e.retryStatus.has(r.Status) && (c.idempotent || e.retryUnsafe)
	}
	var le *Error
	if !errors.As(r.Err, &le) {
		return false
	}
	switch le.Kind {
	case KindTimeout:
		if !e.retryTimeout {
			return false
		}
	case KindUnavailable:
		if !e.retryUnavail {
			return false
		}
	default:
		return false
	}
	return c.idempotent || e.retryUnsafe || le.notSent
}

// backoff returns the wait before attempt n+1: exponential, capped, with jitter.
func (e *Endpoint) backoff(n int) time.Duration {
	d := float64(e.backoff0)
	for i := 1; i < n && d < float64(e.backoffMax); i++ {
		d *= e.multiplier
	}
	d = min(d, float64(e.backoffMax))
	return time.Duration(d * (1 - e.jitter*rand.Float64()))
}

func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// finish delivers r to every waiter, once.
func (c *call) finish(r Response) { c.finishFrom(r, false) }

// finishFrom is finish; async delivers on a new goroutine, for outcomes decided on the
// goroutine of Do, which must not call done.
func (c *call) finishFrom(r Response, async bool) {
	c.mu.Lock()
	if c.state == stateDone {
		c.mu.Unlock()
		return
	}
	c.state = stateDone
	c.mu.Unlock()
	c.forget()
	if r.Err != nil {
		r.Err = c.e.named(r.Err)
	} else if c.cacheable {
		c.e.cache.put(c.key, r)
	}
	c.mu.Lock()
	ws := c.waiters
	c.waiters = nil
	c.mu.Unlock()
	if async {
		go c.deliverAll(ws, r)
	} else {
		c.deliverAll(ws, r)
	}
}

func (c *call) deliverAll(ws []*waiter, r Response) {
	for _, w := range ws {
		if w.stop != nil {
			w.stop()
		}
		c.e.deliver(w, r)
	}
	c.e.live.Done()
}

// named returns err with the endpoint's name filled in.
func (e *Endpoint) named(err error) error {
	var le *Error
	if errors.As(err, &le) && le.Endpoint == "" {
		cp := *le
		cp.Endpoint = e.name
		return &cp
	}
	return err
}

func (e *Endpoint) deliver(w *waiter, r Response) {
	e.account(w.start, r)
	w.done(r)
}

// deliverAsync reports an outcome decided inside Do on a new goroutine, keeping the promise
// that done never runs before Do returns.
// The caller holds a count in e.live (or the endpoint is closed), so Close waits for it.
func (e *Endpoint) deliverAsync(done func(Response), start time.Time, r Response, tracked bool) {
	if r.Err != nil {
		r.Err = e.named(r.Err)
	}
	e.account(start, r)
	if !tracked {
		go done(r)
		return
	}
	e.live.Add(1)
	go func() {
		defer e.live.Done()
		done(r)
	}()
}

func (e *Endpoint) account(start time.Time, r Response) {
	e.m.latency.record(time.Since(start))
	if r.Err != nil {
		k := Kind(r.Err)
		e.m.errors[k].Add(1)
		if k == KindRefused {
			e.refusal(r.Err)
		}
	} else if cl := r.Status / 100; cl >= 1 && cl <= 5 {
		e.m.statuses[cl].Add(1)
	}
}

// refusal counts a refused request by rule and logs it: the first refusal of each rule, then
// at most one line a second per rule, with the count, so that a guest refused in a loop
// cannot flood the log.
func (e *Endpoint) refusal(err error) {
	var le *Error
	errors.As(err, &le) // KindRefused comes only from an *Error
	i := ruleIndex(le.Rule)
	if i < 0 {
		e.log.Error("lookup refused by an unnamed rule (a bug)", "reason", le.Reason)
		return
	}
	n := e.m.refused[i].Add(1)
	now := time.Now().UnixNano()
	last := e.m.refusedLogged[i].Load()
	if (n == 1 || now-last >= int64(time.Second)) && e.m.refusedLogged[i].CompareAndSwap(last, now) {
		e.log.Warn("lookup refused", "rule", le.Rule, "reason", le.Reason, "refused_by_rule", n)
	}
}

func ctxError(err error) *Error {
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Kind: KindTimeout, Reason: "caller's deadline passed", Err: err, notSent: true}
	}
	return &Error{Kind: KindCancelled, Err: err, notSent: true}
}

// follow sends req with rt and follows redirects as net/http's Client does (the same
// method rewriting and body rules), asking checkRedirect before each: no other origin, stay
// under the prefix, at most MaxRedirects. It replaces http.Client, whose per-request copies
// of the request, URL and header the common case (no redirect) does not need.
func (e *Endpoint) follow(req *http.Request, rt func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	var via []*http.Request
	for {
		resp, err := rt(req)
		if err != nil {
			return nil, err
		}
		next, err := e.redirect(req, resp, &via)
		if err != nil {
			return nil, err
		}
		if next == nil {
			return resp, nil
		}
		req = next
	}
}

// redirect decides what follows resp, the response to req: (nil, nil) to return resp;
// (next, nil) to send next (resp's body has been drained and closed); (nil, err) to fail
// (resp's body closed). via collects the requests sent so far.
func (e *Endpoint) redirect(req *http.Request, resp *http.Response, via *[]*http.Request) (*http.Request, error) {
	method, ok, withBody := redirectBehavior(req, resp)
	if !ok {
		return nil, nil
	}
	loc := resp.Header.Get("Location")
	if loc == "" {
		return nil, nil
	}
	u, err := req.URL.Parse(loc)
	if err != nil {
		resp.Body.Close()
		return nil, &Error{Kind: KindUnavailable, Reason: "bad Location in redirect", Err: err}
	}
	*via = append(*via, req)
	next := (&http.Request{
		Method: method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: req.Header, Host: u.Host, Response: resp,
	}).WithContext(req.Context())
	if withBody && req.GetBody != nil {
		if next.Body, err = req.GetBody(); err != nil {
			resp.Body.Close()
			return nil, err
		}
		next.GetBody, next.ContentLength = req.GetBody, req.ContentLength
	}
	if err := e.checkRedirect(next, *via); err != nil {
		if err == http.ErrUseLastResponse {
			return nil, nil
		}
		resp.Body.Close()
		return nil, err
	}
	// Read a little of the old body, so that its connection can be reused (as http.Client).
	if resp.ContentLength == -1 || resp.ContentLength <= 2<<10 {
		io.CopyN(io.Discard, resp.Body, 2<<10)
	}
	resp.Body.Close()
	return next, nil
}

// redirectBehavior is net/http's: 301, 302 and 303 turn a method other than GET and HEAD
// into a GET without body; 307 and 308 resend the method and body (and are not followed if
// the body cannot be resent).
func redirectBehavior(req *http.Request, resp *http.Response) (method string, follow, withBody bool) {
	switch resp.StatusCode {
	case 301, 302, 303:
		method = req.Method
		if method != http.MethodGet && method != http.MethodHead {
			method = http.MethodGet
		}
		return method, true, false
	case 307, 308:
		if req.GetBody == nil && req.ContentLength != 0 {
			return "", false, false
		}
		return req.Method, true, true
	}
	return "", false, false
}

// checkRedirect refuses redirects that leave the endpoint's origin or prefix, and stops after
// MaxRedirects same-origin ones (the 3xx is then the response).
func (e *Endpoint) checkRedirect(req *http.Request, via []*http.Request) error {
	u := req.URL
	if u.Scheme != e.base.Scheme || u.Host != e.base.Host {
		return refused(RuleRedirect, "redirect to another origin ("+u.Scheme+"://"+u.Host+")")
	}
	if len(via) > e.cfg.MaxRedirects {
		return http.ErrUseLastResponse
	}
	p := u.EscapedPath()
	if !isCleanPath(p) || !strings.HasPrefix(p, e.root) || !underPrefix(p[len(e.root):], e.prefix) {
		return refused(RuleRedirect, "redirect outside the endpoint's prefix")
	}
	return nil
}

// Metrics returns a snapshot of the endpoint's metrics.
func (e *Endpoint) Metrics() Metrics {
	var m Metrics
	m.Requests = e.m.requests.Load()
	m.Attempts = e.m.attempts.Load()
	m.Retries = e.m.retries.Load()
	for i := range m.Errors {
		m.Errors[i] = e.m.errors[i].Load()
	}
	for i := range m.Statuses {
		m.Statuses[i] = e.m.statuses[i].Load()
	}
	for i := range m.Refused {
		m.Refused[i] = e.m.refused[i].Load()
	}
	m.CacheHits = e.m.cacheHits.Load()
	m.CacheMisses = e.m.cacheMisses.Load()
	m.SharedCalls = e.m.shared.Load()
	m.Latency = e.m.latency.snapshot()
	m.Upstream = e.m.upstream.snapshot()
	if b := e.breaker; b != nil {
		m.Breaker = b.cb.State()
		m.Transitions = BreakerTransitions{ToOpen: b.stats.toOpen.Load(), ToHalfOpen: b.stats.toHalfOpen.Load(), ToClosed: b.stats.toClosed.Load()}
	}
	ls := e.limiter.stats()
	m.Limit, m.InFlight, m.Queued = ls.limit, ls.inflight, ls.queued
	m.BaselineRTT, m.Setpoint, m.LimitChanges = ls.baseline, ls.setpoint, ls.changes
	return m
}
