package scheduler

// Admission and the task lifecycle: a task's guest call, its completion, and the task pool.

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// execute runs t's guest call on the current carrier. If the call suspends, this carrier parks
// inside it and returns here, holding the runner role again, once the call has completed.
func (c *Controller) execute(t *task) {
	if c.err != nil {
		c.finish(t, nil)
		return
	}
	if len(c.prefetch) > 0 {
		if !t.prefetched && c.awaitPrefetch(t) {
			return // runnable again once its prefetched values are loaded (or room under the cap)
		}
	} else if c.overCap() {
		c.waitForCap(t, false) // its call may suspend: it needs a place under the cap (mayAdmit)
		return
	}
	if c.barrier != nil && c.freezing() && t.kind == kindRecord {
		c.freeze(t) // the barrier captures it instead of waiting for it (capture.go)
		return
	}
	if c.batch.max > 1 && c.batchAdd(t) {
		return // it runs in the next batch call (batch.go)
	}
	if (len(c.pool) == 0 || len(c.slotWait) > 0) && (!c.slotFree() || len(c.slotWait) > 0 && !t.slotWaited) {
		c.waitForSlot(t)
		return
	}
	// acquireSlot's common case written out: on the all-hits path every call saved shows in
	// the hot-path figure (with handle's gate check and keyDone's inlined one, BenchmarkHotPath's
	// thread-CPU ratio went from 1.19 to 1.11).
	var s *slot
	var err error
	if n := len(c.pool); n > 0 {
		s = c.pool[n-1]
		c.pool = c.pool[:n-1]
	} else if s, err = c.acquireSlot(); err != nil {
		c.finish(t, err)
		return
	}
	s.t, t.slot = t, s
	c.running++
	if !c.mode.coro && t.kind == kindRecord {
		// The all-hits path, written out: the guest call and its completion.
		c.hot.records++
		err = s.inst.Process(t.key, t.value, t.ts)
		c.afterCall(t, s, err)
		return
	}
	if c.mode.coro {
		t.inCoro = true
		c.hot.coroCalls++
		c.runInCoroutine(s) // completes t, or leaves it suspended inside the coroutine
		return
	}
	c.afterCall(t, s, c.callGuest(s))
}

// hotReady reports whether the records at the head of the input can take hotRun's path: calls
// run directly and one at a time, and an instance is pooled. What the records themselves decide
// (their kind, their key free, the cap, their prefetched values) is checked per record.
func (c *Controller) hotReady() bool {
	return c.cfg.Order == OrderPerKey && !c.mode.coro && c.batch.max <= 1 &&
		len(c.slotWait) == 0 && len(c.pool) > 0 && len(c.prefetch) <= 1
}

// hotRun is handle, execute, afterCall and finish written out as one loop for the all-hits
// path, with the checks that cannot change while no call suspends hoisted out of it (hotReady,
// handleRun): on that path the controller's bookkeeping per record is what BenchmarkHotPath
// measures. It processes records from the input batch until one is not a plain record, the cap
// or a posted completion needs the runner, or a record leaves the path (its prefetched value is
// cold, its call suspended, failed or used a slow path): that record is completed by the
// general code, and hotRun returns. It reports whether it took a record.
//
// The records of a run use one instance and one task in turn: between two records nothing
// else runs, so the instance goes back to the pool (and its memory growth is accounted) and
// the task to the task pool when the run ends, not after every record.
func (c *Controller) hotRun() bool {
	e := c.epochs[0]
	var s *slot
	var t *task
	took := false
	for len(c.inbuf) > 0 {
		el := &c.inbuf[0]
		// noteExecution may have switched to coroutine calls: they are taken by execute.
		if el.Kind != ElementRecord || el.KeyByWasm || !c.mayAdmit() || c.mode.coro || c.comp.n.Load() != 0 {
			break
		}
		// A record of a busy key parks behind it (handle). Records of free keys take this
		// path while others wait for their values: at a tenth of the state hot most records
		// hit while some key is always busy, and the general path cost them 2.1 µs of the
		// runner's CPU a record against 0.45 here (issue 10).
		var h uint64
		if c.gate.n > 0 {
			if h = c.gate.hash(el.Key); c.gate.find(h, el.Key) != nil {
				break
			}
		}
		c.inbuf = c.inbuf[1:]
		took = true
		if t == nil {
			t = c.newTask()
		} else { // newTask's reset, for the task the last record completed with
			c.seq++
			t.seq, t.effects, t.attempts = c.seq, false, 0
		}
		t.kind = kindRecord
		t.key, t.value, t.ts, t.pos = el.Key, el.Value, el.TS, el.Pos
		t.khash, t.hashed = h, c.gate.n > 0 // the probe's hash, if the gate was probed
		t.ep, t.wm = e, e.startWM
		e.pending++
		c.admitted++
		c.admitInput(t) // before anything can yield the runner role (release.go)
		if len(c.prefetch) == 1 {
			v, found, hot := c.cfg.Backend.Get(state.Key{State: state.StateID(c.prefetch[0]), Record: t.key})
			if !hot {
				if s != nil {
					c.releaseSlot(s)
				}
				t.knownCold = true // its prefetch check queues the load without asking again
				c.execute(t)
				return true
			}
			t.prefetched = true
			// Field by field: appending a pfValue literal composes it on the stack and copies
			// it with wide loads that cannot forward from the narrower stores (a stall that
			// cost ~10 ns a record in a profile of the all-hits path).
			if cap(c.pfHot) == 0 {
				c.pfHot = make([]pfValue, 1, len(c.prefetch))
			}
			c.pfHot = c.pfHot[:1]
			pv := &c.pfHot[0]
			pv.state, pv.value, pv.found = c.prefetch[0], v, found
			c.pfTask, c.pfNext = t, 0
		}
		if s == nil {
			n := len(c.pool) - 1
			s = c.pool[n]
			c.pool = c.pool[:n]
		}
		s.t, t.slot = t, s
		c.running++
		c.hot.records++
		if err := s.inst.Process(t.key, t.value, t.ts); err != nil || t.async {
			c.afterCall(t, s, err) // releases s and completes t
			return true
		}
		// afterCall and finish of a call that completed at once, without a fault (so its
		// instance is not broken): it never entered the gate, held a value or started an
		// async operation, and c.err is still nil.
		c.noteExecution(false)
		c.hotRuns++
		c.running--
		s.t, t.slot = nil, nil
		e.pending--
		c.admitted--
		if t.in != nil {
			c.inputDoneBy(t)
		}
		if c.pfTask == t {
			c.pfTask = nil
		}
		t.reset()
	}
	if s != nil {
		c.releaseSlot(s)
	}
	if t != nil {
		c.freeTask(t)
	}
	return took
}

// callGuest runs the guest call of s's task, on the current carrier or inside s's coroutine.
func (c *Controller) callGuest(s *slot) error {
	t := s.t
	switch t.kind {
	case kindTimer:
		c.hot.timers++
		return s.inst.OnTimer(t.key, t.ts)
	case kindProcTimer:
		c.hot.timers++
		return s.inst.OnProcessingTimer(t.key, t.ts)
	}
	c.hot.records++
	return s.inst.Process(t.key, t.value, t.ts)
}

// afterCall accounts a finished guest call and completes its task.
func (c *Controller) afterCall(t *task, s *slot, err error) {
	c.noteExecution(t.suspendedOnce)
	c.running--
	s.t, t.slot = nil, nil
	c.releaseSlot(s)
	if err != nil && c.retryable(t, err) {
		// A fault that changed nothing: run the record again, on another instance (a broken
		// one was just closed), before its key frees, so per-key order holds. Its lookups get
		// the same indices, so their idempotency keys repeat.
		t.attempts++
		t.lookups, t.lookupErr = 0, nil
		c.metrics.RecordRetries.Add(1)
		c.execute(t)
		return
	}
	c.finish(t, err)
}

// retryable reports whether a failed call of t may run again (WithRecordRetries).
func (c *Controller) retryable(t *task, err error) bool {
	var fault *abi.Fault
	return t.attempts < c.cfg.RecordRetries && c.err == nil && t.kind == kindRecord && !t.effects && t.aborted == nil && errors.As(err, &fault)
}

// finish accounts a completed task: the key frees, the epoch advances, the first error sticks.
func (c *Controller) finish(t *task, err error) {
	if err != nil && c.err == nil {
		where := c.cfg.Describe(t.pos)
		switch t.kind {
		case kindTimer:
			where = fmt.Sprintf("timer at %d", t.ts)
		case kindProcTimer:
			where = fmt.Sprintf("processing-time timer at %d", t.ts)
		}
		oe := &OperatorError{Operator: c.name, Where: where, Key: bytes.Clone(t.key), TS: t.ts, Err: err, Lookup: t.lookupErr}
		var fault *abi.Fault
		if h := c.cfg.OnRecordFailure; h != nil && t.kind == kindRecord && !t.effects && t.aborted == nil && errors.As(err, &fault) {
			// A guest fault that changed nothing: the handler may take the record (a dead
			// letter) and the run goes on.
			if herr := h(RecordFailure{Pos: t.pos, Key: t.key, Value: t.value, TS: t.ts, Attempts: t.attempts + 1, Err: oe}); herr != nil {
				c.fail(herr)
			} else {
				c.metrics.RecordFailures.Add(1)
			}
		} else {
			c.fail(oe)
		}
	}
	c.keyDone(t)
	if t.holds != 0 {
		c.releaseHolds(t)
	}
	if t.held != nil {
		t.held.done = true
		c.releaseHeld()
	}
	t.ep.pending--
	c.admitted--
	if t.captured {
		c.capturedLeft--
	}
	if t.in != nil {
		c.inputDoneBy(t)
	}
	c.freeTask(t)
}

// keyOf runs the guest key function on a pooled instance.
func (c *Controller) keyOf(value []byte) ([]byte, error) {
	s, err := c.acquireSlot()
	if err != nil {
		return nil, err
	}
	k, err := s.inst.Key(value)
	if err == nil {
		k = bytes.Clone(k)
	}
	c.releaseSlot(s)
	return k, err
}

func (c *Controller) newTask() *task {
	c.seq++
	if n := len(c.taskPool); n > 0 {
		t := c.taskPool[n-1]
		c.taskPool = c.taskPool[:n-1]
		t.seq, t.effects, t.attempts = c.seq, false, 0
		return t
	}
	return &task{seq: c.seq}
}

// freeTask is the end of a task. The struct is reused for a later task, except while an
// async operation can still deliver to it.
//
// INVARIANT: a task returns to the pool only when t.io is zero: every lookup it sent and every
// read it queued has delivered and its completion has been taken on the runner (or the read
// was dropped unsent by fail). A task aborted with operations out (the run failed while its
// lookup or fetch was in flight) is marked orphan instead, and delivered() pools it when the
// last one comes in. Without this, a late lookup callback would write t.lookup into a task
// that reset had cleared and a new record was using. Run, for its part, returns only when
// c.outstanding is zero, so no callback outlives it.
func (c *Controller) freeTask(t *task) {
	if c.pfTask == t {
		c.pfTask = nil // its stashed prefetch answers must not reach the task struct's next use
	}
	if t.io > 0 {
		t.orphan = true
		return
	}
	t.reset()
	c.taskPool = append(c.taskPool, t)
}

func (c *Controller) recycle(t *task) {
	t.reset()
	c.taskPool = append(c.taskPool, t)
}
