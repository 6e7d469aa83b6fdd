package lookup

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync/atomic"
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
