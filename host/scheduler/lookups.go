package scheduler

// Lookups: HTTP enrichment calls, suspending the calling task until the answer arrives.

import (
	"context"
	"time"
)

// LookupFunc sends an ABI-framed lookup request through an endpoint and calls done exactly once,
// from any goroutine (or synchronously, for a cached response). A guest-visible failure is an
// abi.Code error; any other error fails the pipeline. request is a view of the guest's memory,
// valid only until LookupFunc returns: a function that needs it later copies it
// (lookup.Endpoint.DoRaw parses it before returning).
type LookupFunc func(ctx context.Context, endpoint uint32, request []byte, done func(status int, body []byte, err error))

// lookupAsync sends a lookup and suspends t until it answers (or returns at once for a response
// the lookup layer answers synchronously, e.g. from its cache).
func (c *Controller) lookupAsync(t *task, endpoint uint32, req []byte) (int, []byte, error) {
	c.metrics.Lookups.Add(1)
	t.async = true
	ctx := c.lookupContext(t)
	if c.cfg.Synchronous {
		status, body, err := c.lookupBlocking(ctx, endpoint, req)
		if err != nil {
			t.lookupErr = err
		}
		return status, body, err
	}
	t.done.Store(0)
	t.io++
	c.outstanding++
	if t.lookupDone == nil {
		t.lookupDone = func(status int, body []byte, err error) {
			t.lookup = lookupResult{status: status, body: body, err: err}
			if t.done.CompareAndSwap(0, 2) {
				return // answered before the caller suspended: it reads t.lookup directly
			}
			c.comp.post(completion{task: t, at: time.Now()})
		}
	}
	c.cfg.Lookup(ctx, endpoint, req, t.lookupDone)
	if t.done.CompareAndSwap(0, 1) {
		c.suspend(t)
		if t.aborted != nil {
			return 0, nil, t.aborted
		}
	} else {
		t.io-- // delivered already, and no completion was posted
		c.outstanding--
	}
	r := t.lookup
	t.lookup = lookupResult{}
	if r.err != nil {
		t.lookupErr = r.err
	}
	return r.status, r.body, r.err
}

// lookupContext is the context of t's next lookup (WithLookupContext).
func (c *Controller) lookupContext(t *task) context.Context {
	t.async = true // t.lookups is reset with the slow-path fields
	n := t.lookups
	t.lookups++
	if c.cfg.LookupContext == nil {
		return c.ioCtx
	}
	return c.cfg.LookupContext(c.ioCtx, LookupCall{Timer: t.kind == kindTimer, Pos: t.pos, TS: t.ts, Key: t.key, Value: t.value, Index: n})
}

func (c *Controller) lookupBlocking(ctx context.Context, endpoint uint32, req []byte) (int, []byte, error) {
	ch := make(chan lookupResult, 1)
	c.cfg.Lookup(ctx, endpoint, req, func(status int, body []byte, err error) {
		ch <- lookupResult{status, body, err}
	})
	r := <-ch
	return r.status, r.body, r.err
}
