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
	coDone      coEvent = iota // the call returned; its result is in slot.coErr
	coSuspended                // the call is waiting in an async import
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

// body is the coroutine: run the slot's current task, report, repeat.
func (s *slot) body(yield func(coEvent) bool) {
	s.co.yield = yield
	for {
		s.co.err = s.c.callGuest(s)
		if !yield(coDone) {
			return
		}
	}
}

// runInCoroutine starts t's call inside s's coroutine. It reports whether the call finished
// (its error in s.co.err); otherwise t is suspended inside the coroutine.
func (c *Controller) runInCoroutine(s *slot) bool {
	if s.co.next == nil {
		s.co.next, s.co.stop = iter.Pull(s.body)
	}
	s.co.in = true
	ev, _ := s.co.next()
	if ev == coDone {
		s.co.in = false
		return true
	}
	return false
}

// resumeCoroutine continues a task suspended inside its slot's coroutine, and completes it if
// the call returns.
func (c *Controller) resumeCoroutine(t *task) {
	s := t.slot
	ev, _ := s.co.next()
	if ev == coDone {
		s.co.in = false
		c.afterCall(t, s, s.co.err)
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
