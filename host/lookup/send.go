package lookup

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/attempt"
	"github.com/clink-wasm/clink-wasm/host/lookup/internal/h2"
)

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
	tr, req := c.pick()
	// The attempt's deadline is the transport's (a connection's deadline for h1, a timer
	// heap for h2c, a context for net/http), and stop cancels through c.att whichever it is.
	c.att.Reset(t0.Add(e.timeout))
	c.att.Context = e.ctx // bounds a dial; Close aborts exchanges through the transports
	c.mu.Lock()
	c.state = stateSending
	abandoned := c.abandoned
	c.mu.Unlock()
	if abandoned {
		c.att.Cancel()
	}
	c.tr, c.t0, c.req, c.via = tr, t0, req, c.via[:0]
	if !tr.Blocking() {
		if c.doneFn == nil {
			c.doneFn = c.exchanged // one method value per call, not per attempt
		}
		tr.Start(req, &c.att, c.doneFn)
		return nil // the completion ends the attempt and starts the next queued call
	}
	ex, direct := tr.(exchanger)
	if !direct && c.syncFn == nil {
		c.syncFn = func(resp *http.Response, err error) { c.syncResp, c.syncErr = resp, err }
	}
	// A blocking transport: the exchanges (the request, then the redirects it follows) run
	// here, one after the other, and the next queued call is returned to send's loop.
	for {
		var resp *http.Response
		var err error
		if direct {
			resp, err = ex.Exchange(c.req, &c.att)
		} else {
			tr.Start(c.req, &c.att, c.syncFn)
			resp, err = c.syncResp, c.syncErr
			c.syncResp, c.syncErr = nil, nil
		}
		if err == nil {
			var next *http.Request
			if next, err = e.redirect(c.req, resp, &c.via); next != nil {
				c.req = next
				continue
			}
			if err != nil {
				resp = nil
			}
		}
		c.req = nil
		return c.attemptEnd(t0, resp, err)
	}
}

// pick returns the transport of the call's next attempt and its request: the endpoint's
// own (h1 or h2c) if it handles the request, else net/http, which gets a request of its own
// (it keeps it beyond the attempt).
func (c *call) pick() (transport, *http.Request) {
	if t := c.e.primary; t != nil {
		c.fillRequest(&c.hreq)
		if t.Handles(&c.hreq) {
			return t, &c.hreq
		}
	}
	r := new(http.Request)
	c.fillRequest(r)
	return c.e.std, r
}

// blocking reports whether the call's next attempt would block its goroutine.
func (c *call) blocking() bool {
	t, _ := c.pick()
	return t.Blocking()
}

// exchanged is the completion of an exchange over a non-blocking transport: it follows a
// redirect with another exchange, or ends the attempt and starts the call the limiter hands
// over, on this goroutine if that one does not block either.
func (c *call) exchanged(resp *http.Response, err error) {
	e := c.e
	if err == nil {
		var next *http.Request
		if next, err = e.redirect(c.req, resp, &c.via); next != nil {
			c.req = next
			c.tr.Start(next, &c.att, c.doneFn)
			return
		}
		if err != nil {
			resp = nil
		}
	}
	c.req = nil
	if next := c.attemptEnd(c.t0, resp, err); next != nil {
		if !next.blocking() {
			next.send()
		} else {
			go next.send() // h1 and net/http block: not on the transport's goroutine
		}
	}
}

// attemptEnd ends an attempt (c.att): reads the body, classifies the outcome, and hands it
// to outcome.
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
