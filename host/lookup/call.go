package lookup

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/attempt"
	"github.com/sony/gobreaker/v2"
)

// waiter is one Do waiting on a call.
type waiter struct {
	done  func(Response)
	start time.Time

	// The watch on the waiter's context (watches.go). c is set by watch, before w can be
	// delivered, and never changes; the rest is guarded by the endpoint's watches.mu.
	c            *call
	group        *watchGroup
	wprev, wnext *waiter
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
	// Small fields together, against padding (a call is allocated per request).
	state     callState // guarded by mu
	abandoned bool      // the last waiter left; guarded by mu
	queued    bool      // in the limiter queue; guarded by limiter.mu

	first waiter     // the waiter that created the call, to save an allocation
	one   [1]*waiter // backing array of waiters for the common single waiter

	mu        sync.Mutex
	waiters   []*waiter       // guarded by mu
	att       attempt.Attempt // deadline, cancellation, marks of the attempt on the wire
	hreq      http.Request    // the request of an attempt over h1 or h2c (net/http gets its own)
	timer     *time.Timer     // backoff timer; guarded by mu
	closeStop func() bool     // stops the Close hook of a call in backoff; guarded by mu
	attempts  int             // attempts started; written only by the driving goroutine
	last      Response        // last attempt's outcome, for a breaker rejection mid-retry
	bdone     func(err error) // breaker completion of the current attempt

	// The attempt on the wire (sendOne); written by the driving side.
	tr       transport
	t0       time.Time
	req      *http.Request               // the exchange on the wire: the request or a redirect
	via      []*http.Request             // redirects followed
	doneFn   func(*http.Response, error) // exchanged or, for a blocking transport, syncDone
	syncFn   func(*http.Response, error)
	syncResp *http.Response // a blocking exchange's outcome
	syncErr  error

	// Limiter queue linkage and probe epoch (gradient: phase); guarded by limiter.mu.
	qprev, qnext *call
	qAt          time.Time
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

// join adds w to a shared call in flight. It reports false if c is finished or abandoned by
// its last waiter; the caller then starts a new call. The caller holds e.flightMu.
func (c *call) join(ctx context.Context, w *waiter) bool {
	c.mu.Lock()
	if c.state == stateDone || c.abandoned {
		c.mu.Unlock()
		return false
	}
	c.waiters = append(c.waiters, w)
	c.watch(ctx, w) // before the call can deliver to w, which needs c.mu
	c.mu.Unlock()
	return true
}

func (c *call) watch(ctx context.Context, w *waiter) { c.e.watches.watch(ctx, c, w) }

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
		c.att.Cancel() // every transport cancels through the attempt
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
	case ok && (inline || !c.blocking()):
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
		c.e.watches.unwatch(w)
		c.e.deliver(w, r)
	}
	c.e.live.Done()
}
