package scheduler

// Epochs and barriers: releasing closed epochs (due timers, then the watermark) and completing a
// drained barrier.

import (
	"fmt"
	"log/slog"
	"math"
	"time"
)

type epoch struct {
	pending int   // admitted tasks of this epoch not yet complete
	startWM int64 // watermark its records see
	closeWM int64
	closed  bool
	firing  bool
	due     []timerEntry
	// procTime > 0: closed by the clock, not by a watermark: its release fires the
	// processing-time timers due at procTime and forwards no watermark.
	procTime int64
}

// releaseStep advances the oldest closed epoch: once its tasks are done it fires its due timers
// (as tasks of that epoch, as capacity allows), and once those are done too it forwards the
// watermark. It reports whether it did anything.
func (c *Controller) releaseStep() bool {
	if len(c.epochs) < 2 {
		return false
	}
	e := c.epochs[0]
	if !e.closed || (e.pending > 0 && !e.firing) {
		return false
	}
	if !e.firing {
		e.firing = true
		if e.procTime != 0 {
			e.due = c.ptimers.popDue(e.procTime)
		} else {
			e.due = c.timers.popDue(e.closeWM)
		}
	}
	if len(e.due) > 0 {
		te := e.due[0]
		if !c.mayAdmitTimer(te.key) {
			return false
		}
		e.due = e.due[1:]
		t := c.newTask()
		t.kind = kindTimer
		if e.procTime != 0 {
			t.kind = kindProcTimer
		}
		t.key, t.ts, t.pos = []byte(te.key), te.ts, -1
		t.ep, t.wm = e, e.closeWM
		e.pending++
		c.admitted++
		c.submit(t, true)
		return true
	}
	if e.pending > 0 {
		return false
	}
	// Timers registered during this release for times at or before the watermark fire at the
	// next one (docs/abi.md). At end of input there is no next one: fire them now, bounded.
	if e.closeWM == math.MaxInt64 && e.procTime == 0 && c.timers.hasDue(e.closeWM) {
		e.due = c.timers.popDue(e.closeWM)
		return true
	}
	c.epochs[0] = nil
	c.epochs = c.epochs[1:]
	if e.procTime != 0 {
		c.ptClosing = false
		return true // the watermark did not move: nothing to forward
	}
	c.watermark = e.closeWM
	c.metrics.Watermarks.Add(1)
	if err := c.out.mark(OutputWatermark, e.closeWM); err != nil {
		c.fail(err)
	}
	return true
}

func (c *Controller) completeBarrier() {
	id := *c.barrier
	drained := time.Now()
	if !c.captureInput(id) {
		return // the barrier drains every admitted task instead (capture.go)
	}
	c.barrier, c.drainOnly, c.captureThis = nil, false, false
	defer c.unfreeze() // after the barrier's mark: the frozen calls' outputs follow it
	c.metrics.BarrierDrainNanos.Add(int64(drained.Sub(c.barrierAt)))
	c.saveTimers()
	if c.cfg.OnBarrier != nil {
		err := c.cfg.OnBarrier(id)
		if err != nil {
			c.metrics.BarrierCaptureNanos.Add(int64(time.Since(drained)))
			c.fail(fmt.Errorf("checkpoint %d: %w", id, err))
			return
		}
	}
	c.metrics.BarrierCaptureNanos.Add(int64(time.Since(drained))) // the captured input, the timers, OnBarrier
	c.metrics.Barriers.Add(1)
	if c.log.Enabled(c.ctx, slog.LevelDebug) {
		c.log.LogAttrs(c.ctx, slog.LevelDebug, "barrier drained", slog.Uint64("checkpoint", id),
			slog.Duration("drain", drained.Sub(c.barrierAt)), slog.Duration("capture", time.Since(drained)))
	}
	if err := c.out.mark(OutputBarrier, int64(id)); err != nil {
		c.fail(err)
	}
}

// SaveTimers stores the timer queues in the backend's operator state; used before a final
// savepoint when no barrier passed.
func (c *Controller) SaveTimers() {
	c.saveTimers()
	if c.inputSet && c.admitted == 0 {
		c.cfg.Backend.SetOperatorState(InputStateName, nil) // replayed: none is left
		c.inputSet = false
	}
}

func (c *Controller) saveTimers() {
	c.cfg.Backend.SetOperatorState(timersStateName, c.timers.marshal())
	if c.ptUsed {
		c.cfg.Backend.SetOperatorState(procTimersStateName, c.ptimers.marshal())
	}
}

// procTimersDue closes the open epoch for the processing-time timers due now, if any (and if
// no such epoch is already waiting for its release, and no barrier is draining). It reports
// whether it did.
func (c *Controller) procTimersDue() bool {
	if c.ptClosing || c.barrier != nil {
		return false
	}
	next, ok := c.ptimers.next()
	if !ok {
		return false
	}
	now := time.Now().UnixMilli()
	if next > now {
		return false
	}
	e := c.epochs[len(c.epochs)-1]
	e.closed, e.closeWM, e.procTime = true, c.lastWM, max(now, 1)
	c.epochs = append(c.epochs, &epoch{startWM: c.lastWM})
	c.ptClosing = true
	return true
}

// PendingTimers returns the number of registered timers, of both kinds.
func (c *Controller) PendingTimers() int { return c.timers.len() + c.ptimers.len() }
