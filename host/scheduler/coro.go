package scheduler

import "iter"

// Two ways to run a guest call
//
// A call can run directly on the runner's carrier (carrier.go): free when it does not suspend,
// but a suspension then hands the runner role to another goroutine through channels, a trip
// through the Go scheduler (and, with two Ps, often a futex wake-up on the other CPU) on the
// way out and again on the way back.
//
// Or it can run inside its instance's coroutine (iter.Pull, created once per pooled instance):
// entering and leaving costs a coroutine switch (~100 ns) even when nothing suspends, but a
// suspension is a yield back to the runner and a resume is a next(), with no scheduler
// involvement at all, and the runner stays on one goroutine.
//
// The controller picks per call, from the recent suspension rate: direct while calls rarely
// suspend (the all-hits path pays nothing), coroutines once more than about one call in
// sixteen does (a cold-heavy workload pays ~100 ns per call to save microseconds per miss).
// Both kinds of suspended call can coexist; each task remembers how it runs.

// coEvent is what a slot's coroutine reports when it gives control back.
type coEvent uint8

const (
	coDone      coEvent = iota // the call of the slot's task returned; its result is in slot.co.err
	coSuspended                // the call of the slot's task is waiting in an async import
	coIdle                     // every call run in the coroutine returned and was completed there (chaining)
)

const (
	modeWindow  = 256 // executions per decision
	coEnterRate = 16  // coroutines when suspensions > window/16
	coLeaveRate = 64  // direct again when suspensions < window/64
)

// coState is the coroutine of a slot.
type coState struct {
	next  func() (coEvent, bool)
	stop  func()
	yield func(coEvent) bool
	err   error // result of the call that just finished
	in    bool  // a call is running (or suspended) inside the coroutine
}

// body is the coroutine: run the slot's current task, report, repeat. A call that returns
// without a fault may be followed by the next record's call in the same coroutine (chainNext),
// without a switch back to the runner's goroutine and in again.
func (s *slot) body(yield func(coEvent) bool) {
	s.co.yield = yield
	for {
		s.co.err = s.c.callGuest(s)
		ev := coDone
		if s.c.chainable(s) {
			if s.c.chainNext(s) {
				continue
			}
			ev = coIdle
		}
		if !yield(ev) {
			return
		}
	}
}

// Chaining calls in a coroutine
//
// At a high suspension rate every call runs in its instance's coroutine, and a call that does
// not suspend costs two switches (in, and back out to the runner's goroutine) for nothing: in
// the suspension path's profile a switch into a stack that went cold while hundreds of others
// ran costs ~140 ns. So when a call returns inside its coroutine and the runner's next step
// would be to take the next input record, the coroutine takes that step itself: the runner
// role is with whoever runs, and the runner's goroutine is blocked in next() meanwhile. It
// completes the call (afterCall), admits the record (handle), and when the record's call would
// run on this same instance (the pool is LIFO, so it does whenever the instance went back to
// the pool), runInCoroutine only marks it (c.chained) and the body loop runs it. If the record
// took another path (it parked behind its key, waits for the cap or for prefetched values), the
// coroutine reports coIdle: everything it ran is complete.
//
// INVARIANT: the coroutine never calls next() of its own slot (c.coroHere is the slot whose
// coroutine is running the runner's step), and it takes one step only, so coroutines never
// nest. The goroutine that entered it learns what happened from the event alone: coDone and
// coSuspended concern s.t, the slot's current task, which need not be the task it started.

// chainable reports whether the call that just returned in s's coroutine can be completed
// there: it did not fail (a retry or a failure takes the runner's general paths) and nothing
// the runner's step below does not cover is in use.
func (c *Controller) chainable(s *slot) bool {
	return s.co.err == nil && s.t != nil && s.t.kind == kindRecord && !s.inst.Broken() &&
		c.mode.coro && c.batch.max <= 1 && !c.ptUsed && c.err == nil
}

// chainNext completes the call that just returned in s's coroutine and takes the runner's
// next step when it is to start a call (Controller.loop's order: a runnable task, a task
// waiting for room under the cap, the next input record) and nothing before it in the loop is
// pending. It reports whether that step started a call on s, for the body to run.
func (c *Controller) chainNext(s *slot) bool {
	c.afterCall(s.t, s, nil)
	if !c.mode.coro || len(c.pool) == 0 || c.pool[len(c.pool)-1] != s || c.err != nil ||
		c.comp.n.Load() != 0 || len(c.ready) != 0 || len(c.slotWait) != 0 ||
		c.maxInFlightSet.Load() != 0 || c.out.err != nil || c.ctx.Err() != nil {
		return false
	}
	c.coroHere = s
	if len(c.runnable) > 0 {
		t := c.runnable[0]
		c.runnable[0] = nil
		c.runnable = c.runnable[1:]
		c.execute(t)
	} else if len(c.fills) == 0 {
		if t := c.nextCapWaiter(); t != nil {
			c.execute(t)
		} else if c.inputNext() {
			el := &c.inbuf[0]
			c.inbuf = c.inbuf[1:]
			c.handle(el)
		}
	}
	c.coroHere = nil
	chained := c.chained
	c.chained = false
	return chained
}

// runInCoroutine starts the call of s's task inside s's coroutine. It reports whether the call
// finished and still needs completing (afterCall of s.t, its error in s.co.err); otherwise the
// task is suspended inside the coroutine, or the coroutine completed it itself.
func (c *Controller) runInCoroutine(s *slot) bool {
	if c.coroHere == s {
		c.chained = true // inside s's coroutine already: its body runs the call (chainNext)
		c.hot.chained++
		return false
	}
	if s.co.next == nil {
		s.co.next, s.co.stop = iter.Pull(s.body)
	}
	s.co.in = true
	ev, _ := s.co.next()
	switch ev {
	case coDone:
		s.co.in = false
		return true
	case coIdle:
		s.co.in = false
	}
	return false
}

// resumeCoroutine continues a task suspended inside its slot's coroutine, and completes the
// slot's task if its call returns.
func (c *Controller) resumeCoroutine(t *task) {
	s := t.slot
	ev, _ := s.co.next()
	switch ev {
	case coDone:
		s.co.in = false
		c.afterCall(s.t, s, s.co.err)
	case coIdle:
		s.co.in = false
	}
}

// stopCoroutine ends a slot's coroutine (the slot is being retired). The coroutine is parked at
// its top-level yield: no call is inside it.
func (s *slot) stopCoroutine() {
	if s.co.stop != nil && !s.co.in {
		s.co.stop()
		s.co.next, s.co.stop = nil, nil
	}
}

// ExecMode chooses how guest calls run (see the comment at the top of coro.go).
type ExecMode uint8

const (
	ExecAuto      ExecMode = iota // direct or coroutine, from the recent suspension rate
	ExecDirect                    // always on the runner's carrier
	ExecCoroutine                 // always inside the instance's coroutine
)

// noteExecution feeds the mode decision with whether the call that just ran suspended.
func (c *Controller) noteExecution(suspended bool) {
	if c.cfg.ExecMode != ExecAuto {
		return
	}
	c.mode.execs++
	if suspended {
		c.mode.suspends++
	}
	if c.mode.execs < modeWindow {
		return
	}
	switch {
	case !c.mode.coro && c.mode.suspends > modeWindow/coEnterRate:
		c.mode.coro = true
	case c.mode.coro && c.mode.suspends < modeWindow/coLeaveRate:
		c.mode.coro = false
	}
	c.mode.execs, c.mode.suspends = 0, 0
}

// execMode is the controller's current choice between direct and coroutine calls.
type execMode struct {
	coro            bool
	execs, suspends int
}

// seqCheck keeps the iter import honest if the body signature drifts.
var _ iter.Seq[coEvent] = (*slot)(nil).body
