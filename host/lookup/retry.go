package lookup

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"
)

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
