package scheduler

// Completions: the hand-back from IO goroutines to the runner, and resuming the tasks they wake.

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// completions is the hand-back from IO goroutines to the runner.
type completions struct {
	n    atomic.Int32 // len(q), readable without the lock: the loop checks it every iteration
	mu   sync.Mutex
	q    []completion
	wake chan struct{} // cap 1
}

type completion struct {
	batch *readBatch
	task  *task        // a finished lookup
	spare *spareResult // a spare instance (spares.go)
	run   func()       // a call a spare's setup needs made on the runner (not outstanding)
	at    time.Time
}

func (q *completions) post(c completion) {
	q.mu.Lock()
	q.q = append(q.q, c)
	q.n.Store(int32(len(q.q)))
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *completions) take(dst []completion) []completion {
	if q.n.Load() == 0 {
		return dst
	}
	q.mu.Lock()
	q.n.Store(0)
	dst = append(dst, q.q...)
	clear(q.q)
	q.q = q.q[:0]
	q.mu.Unlock()
	return dst
}

// complete installs a completion on the runner and queues its tasks for resumption.
func (c *Controller) complete(cp completion) {
	if cp.run != nil {
		cp.run()
		return
	}
	c.outstanding--
	if cp.spare != nil {
		c.adoptSpare(cp.spare)
		return
	}
	if b := cp.batch; b != nil {
		if b.err != nil {
			c.fail(fmt.Errorf("state backend: %w", b.err))
		} else {
			c.fill(b)
			if lat := cp.at.Sub(b.issued); c.fetchEWMA == 0 {
				c.fetchEWMA = lat
			} else {
				c.fetchEWMA += (lat - c.fetchEWMA) / 8
			}
		}
		for i, r := range b.reads {
			t := r.t
			if c.delivered(t) || b.err != nil {
				continue // its task was aborted, or is aborted with everything else
			}
			if r.prefetch {
				if c.holder != nil {
					t.holds |= 1 << slices.Index(c.prefetch, uint32(r.key.State)) // FillHold held it
				}
				if t.prefetchWait--; t.prefetchWait == 0 {
					c.runnable = append(c.runnable, t)
				}
				continue
			}
			t.fetched = b.results[i]
			t.waitFrom = cp.at
			c.ready = append(c.ready, t)
		}
		return
	}
	if c.delivered(cp.task) {
		return
	}
	cp.task.waitFrom = cp.at
	c.ready = append(c.ready, cp.task)
}

// delivered accounts one async operation of t as delivered, and reports whether t was aborted
// and freed while it was out: then the operation has nothing left to deliver to, and the task
// goes back to the pool once its last operation is in (see freeTask).
func (c *Controller) delivered(t *task) bool {
	t.io--
	if !t.orphan {
		return false
	}
	if t.io == 0 {
		t.orphan = false
		c.recycle(t)
	}
	return true
}

func (c *Controller) nextReady() *task {
	if len(c.ready) == 0 {
		return nil
	}
	if c.cfg.ResumeOrder == ResumePriority && len(c.ready) > 1 {
		slices.SortStableFunc(c.ready, func(a, b *task) int {
			switch {
			case a.order < b.order:
				return -1
			case a.order > b.order:
				return 1
			}
			return 0
		})
	}
	t := c.ready[0]
	c.ready[0] = nil
	c.ready = c.ready[1:]
	return t
}

func (c *Controller) anySuspended() *task {
	if len(c.suspended) == 0 {
		return nil
	}
	return c.suspended[len(c.suspended)-1]
}

// resumeTask hands the runner role to suspended task t.
func (c *Controller) resumeTask(self *carrier, t *task) {
	if !t.suspended {
		return
	}
	c.metrics.Resumes.Add(1)
	if !t.waitFrom.IsZero() {
		c.metrics.ResumeLatencyNanos.Add(int64(time.Since(t.waitFrom)))
	}
	if t.inCoro {
		c.resumeCoroutine(t)
		return
	}
	c.resume(self, t)
}
