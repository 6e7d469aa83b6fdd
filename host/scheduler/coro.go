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
	coDone      coEvent = iota // the call returned; its result is in slot.co.err, its task is s.t
	coSuspended                // the call is waiting in an async import
	coFinished                 // the calls returned and were completed inside the coroutine (chain)
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

// body is the coroutine: run the slot's current task, chain the next input records into it
// while the runner would take them next (chain), report, repeat.
func (s *slot) body(yield func(coEvent) bool) {
	s.co.yield = yield
	c := s.c
	for {
		err := c.callGuest(s)
		ev := coDone
		for err == nil && c.chainable(s) {
			c.afterCall(s.t, s, nil)
			ev = coFinished
			if !c.chain(s) {
				break
			}
			ev = coDone
			err = c.callGuest(s)
		}
		s.co.err = err
		if !yield(ev) {
			return
		}
	}
}

// Chained calls
//
// A call that returns inside its coroutine would yield to the runner, which, with nothing
// ready to resume, takes the next input record and enters a coroutine again for its call:
// usually the same slot's, the pool being a stack. Two coroutine switches (~150 ns each on
// session 12's host) for a call that hits, and one of the four of a call that suspends, go to
// that round trip. Instead the coroutine completes its call itself and takes the input the
// runner would take (handle, the same code, under handleRun's conditions); the record that lands
// on this slot runs here at once, and the chain goes on until a call suspends, fails, or the
// runner has something else to do (a completion posted, a call ready, a task runnable). The
// runner's role is the coroutine's meanwhile, as it is for a guest's host calls: the runner is
// blocked in next. Nothing but the order of two independent steps changes: the gate, the cap,
// epochs and barriers see exactly the records handleRun would have admitted.

// chainable reports whether s's call, which returned without error, may be completed inside its
// coroutine and the next input taken there.
func (c *Controller) chainable(s *slot) bool {
	return c.mode.coro && s.batch == nil && !s.inst.Broken() && c.inputTurn()
}

// chain takes input records, after s's call has been completed (afterCall), until one lands on
// s: it reports whether s has a new call to run. A record that parks, or waits for its
// prefetched values or for room under the cap, is admitted as handleRun would admit it.
func (c *Controller) chain(s *slot) bool {
	for c.mode.coro && c.inputTurn() && len(c.slotWait) == 0 {
		if n := len(c.pool); n == 0 || c.pool[n-1] != s {
			return false // execute would take another slot: its coroutine is entered from the runner
		}
		el := &c.inbuf[0]
		if el.Kind != ElementRecord || el.KeyByWasm {
			return false
		}
		c.inbuf = c.inbuf[1:]
		c.coSelf = s
		c.handle(el)
		c.coSelf = nil
		if s.t != nil {
			return true
		}
	}
	return false
}

// runInCoroutine starts the call of s's task inside s's coroutine. When s is the coroutine
// chaining input (chain), the call runs there once handle returns.
func (c *Controller) runInCoroutine(s *slot) {
	if s == c.coSelf {
		return
	}
	if s.co.next == nil {
		s.co.next, s.co.stop = iter.Pull(s.body)
	}
	s.co.in = true
	c.coEnters++
	c.coReturned(s)
}

// resumeCoroutine continues a task suspended inside its slot's coroutine.
func (c *Controller) resumeCoroutine(t *task) { c.coReturned(t.slot) }

// coReturned gives control to s's coroutine and takes what it reports: a call that returned
// (the last one the coroutine ran, s.t) is completed, and suspended ones are left where they are.
func (c *Controller) coReturned(s *slot) {
	switch ev, _ := s.co.next(); ev {
	case coDone:
		s.co.in = false
		c.afterCall(s.t, s, s.co.err)
	case coFinished:
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
