package lookup

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/h1"
	"github.com/clink-wasm/clink-wasm/host/lookup/internal/h2"
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

	transport *http.Transport // net/http's: the "std" transport, and the others' fallback
	primary   transport       // h1Transport or *h2.Transport; nil for "std" and https
	std       stdTransport    // net/http behind the seam: what primary does not handle
	breaker   *sharedBreaker  // nil when disabled
	limiter   *limiter
	cache     *cache // nil when disabled
	registry  *Registry
	log       *slog.Logger // with the tenant and endpoint name

	ctx    context.Context // cancelled by Close; parent of every call's context
	cancel context.CancelFunc

	flightMu sync.Mutex
	flights  map[string]*call // guarded by flightMu

	watches watches // the waiters' contexts

	closeMu sync.RWMutex
	closed  bool           // guarded by closeMu
	live    sync.WaitGroup // calls not yet finished; Add under closeMu.RLock

	m counters
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
		e.primary = &h2.Transport{
			Dial:                   g.DialContext, // the egress checks run before every connect
			Context:                e.ctx,
			MaxResponseHeaderBytes: int(e.transport.MaxResponseHeaderBytes),
			MaxBodyBytes:           e.maxBody,
			IdleConnTimeout:        e.transport.IdleConnTimeout,
			Sensitive:              names, // injected headers carry credentials: never HPACK-indexed
			// The endpoint reads a response's header fields only to follow a redirect
			// (Location) and to retry (Retry-After); Response carries none of them.
			HeadersFor: e.headersFor,
		}
	}
	if tr == "h1" && base.Scheme == "http" {
		e.primary = h1Transport{&h1.Transport{
			Dial:                   g.DialContext, // the egress checks run before every connect
			Fallback:               e.transport,
			MaxIdleConnsPerHost:    cfg.MaxInFlight,
			IdleConnTimeout:        e.transport.IdleConnTimeout,
			MaxResponseHeaderBytes: int(e.transport.MaxResponseHeaderBytes),
			MaxBodyBytes:           e.maxBody,
			HeadersFor:             e.headersFor,
		}}
	}
	e.std = stdTransport{rt: e.transport, ctx: e.ctx}
	return e, nil
}

// headersFor says for which response statuses the endpoint reads the header fields: to
// follow a redirect (Location) and to retry (Retry-After). Response carries none of them.
func (e *Endpoint) headersFor(status int) bool {
	return status/100 == 3 || e.retryStatus.has(status)
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
	if e.primary != nil {
		e.primary.Close() // aborts exchanges on the wire, as the cancelled context does for net/http
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
	c.setIdempotencyKey(ctx)
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
//
// raw is the caller's again when DoRaw returns: it is copied once, and the request parsed in
// place over the copy (ParseRequest copies the head, the header fields and the body apiece).
func (e *Endpoint) DoRaw(ctx context.Context, raw []byte, done func(Response)) {
	req, err := parseRequest(bytes.Clone(raw), true)
	if err != nil {
		e.m.requests.Add(1)
		e.deliverAsync(done, time.Now(), Response{Err: err}, false)
		return
	}
	e.Do(ctx, req, done)
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

type idempotencyKeyCtx struct{}

// WithIdempotencyKey returns a context under which Do sends key as the Idempotency-Key header
// of a request that is not idempotent (POST, PATCH) and has none of its own, on every attempt
// of the call: an upstream that deduplicates by it sees one effect for retries, and for a
// replayed record that presents the same key. The pipeline runtime derives the key from the
// record and the lookup's index in it.
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, idempotencyKeyCtx{}, key)
}

// IdempotencyHeader is the header WithIdempotencyKey sets.
const IdempotencyHeader = "Idempotency-Key"

func (c *call) setIdempotencyKey(ctx context.Context) {
	key, _ := ctx.Value(idempotencyKeyCtx{}).(string)
	if key == "" || c.idempotent || c.header.Get(IdempotencyHeader) != "" {
		return
	}
	h := make(http.Header, len(c.header)+1) // c.header may be the endpoint's shared one
	for k, v := range c.header {
		h[k] = v
	}
	h.Set(IdempotencyHeader, key)
	c.header = h
}
