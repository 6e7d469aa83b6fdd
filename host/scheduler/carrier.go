package scheduler

// The runner role
//
// The seed engine resumes coroutines only on the runner thread, which keeps the per-key gate,
// the in-flight table and the epoch bookkeeping lock-free. Go has no coroutine that a blocked
// host function can switch out of cheaply, so we keep the rule but make "runner" a role, not a
// goroutine: the runner role is held by exactly one goroutine at a time (its *carrier*), and the
// controller's state is touched only by the holder.
//
// A guest call runs directly on the holder, with no switch at all; this is what keeps the
// all-hits path within a few percent of a plain synchronous loop (an iter.Pull coroutine per
// instance costs ~110 ns per call even when nothing suspends, measured on wazero 1.12 here).
// When an import must wait (a cold read, an HTTP lookup), the holder cannot return to the loop
// because the guest's frames are on its stack, so it hands the role to an idle carrier (or a new
// one) and parks. When the value arrives, the then-current holder hands the role back to the
// parked carrier, which returns the value into the guest, and itself becomes idle.
//
// INVARIANT: exactly one carrier is not parked at any time; it is c.cur. Every hand-off is a
// channel send to the next holder followed by a receive on the sender's own channel, so each
// holder's writes happen-before the next holder's reads and the race detector agrees.

// carrier is a goroutine that can hold the runner role.
type carrier struct {
	wake chan struct{} // cap 1: a hand-off never blocks the sender
}

func newCarrier() *carrier { return &carrier{wake: make(chan struct{}, 1)} }

// handOff gives the runner role to next and parks self until the role comes back.
func (c *Controller) handOff(self, next *carrier, spawn bool) {
	c.cur = next
	if spawn {
		c.carrierW.Add(1)
		go c.carry(next)
	} else {
		next.wake <- struct{}{}
	}
	<-self.wake
	// We hold the role again; whoever woke us set c.cur = self.
}

// carry is the body of every carrier goroutine but the first: run the loop as the holder.
func (c *Controller) carry(self *carrier) {
	defer c.carrierW.Done()
	c.loop(self)
}

// suspend parks t, whose guest call is waiting in an async import, until resumeTask continues
// it: inside its slot's coroutine a yield back to the runner, on a carrier a hand-off of the
// runner role. It runs inside t's guest call, holding the runner role.
func (c *Controller) suspend(t *task) {
	t.suspended, t.suspendedOnce, t.async = true, true, true
	t.suspIdx = len(c.suspended)
	c.suspended = append(c.suspended, t)
	c.hot.suspensions++
	c.markKeyBusy(t)
	if t.slot.batch != nil {
		c.batchSuspended(t.slot)
	}
	t.slot.inst.NoteSuspended() // its CPU share's running slot is free until NoteResumed
	if t.inCoro {
		if !t.slot.co.yield(coSuspended) {
			t.aborted = ErrAborted // the coroutine is being stopped
		}
	} else {
		c.suspendCarrier(t)
	}
	t.suspended = false
	c.unsuspend(t)
	t.slot.inst.NoteResumed()
}

// unsuspend takes t out of c.suspended: the last one takes its place.
func (c *Controller) unsuspend(t *task) {
	i, last := t.suspIdx, len(c.suspended)-1
	c.suspended[i] = c.suspended[last]
	c.suspended[i].suspIdx = i
	c.suspended[last] = nil
	c.suspended = c.suspended[:last]
	t.suspIdx = -1
}

// suspendCarrier parks the current carrier inside t's call and hands the runner role on.
func (c *Controller) suspendCarrier(t *task) {
	self := c.cur
	t.carrier = self
	var next *carrier
	spawn := false
	if n := len(c.idle); n > 0 {
		next = c.idle[n-1]
		c.idle = c.idle[:n-1]
	} else {
		next = newCarrier()
		spawn = true
	}
	c.handOff(self, next, spawn)
}

// resume hands the role to the carrier of suspended task t and parks self as idle until some
// suspension needs a carrier again.
func (c *Controller) resume(self *carrier, t *task) {
	c.idle = append(c.idle, self)
	c.handOff(self, t.carrier, false)
}
