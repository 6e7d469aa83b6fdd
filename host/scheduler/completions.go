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
			c.deliver(b, 0, len(b.reads), cp.at)
			c.recycleBatch(b)
			return
		}
		if lat := cp.at.Sub(b.issued); c.fetchEWMA == 0 {
			c.fetchEWMA = lat
		} else {
			c.fetchEWMA += (lat - c.fetchEWMA) / 8
		}
		if c.holder == nil || len(b.reads) <= fillPartKeys {
			c.fill(b, 0, len(b.reads))
			c.deliver(b, 0, len(b.reads), cp.at)
			c.recycleBatch(b)
			return
		}
		c.fills = append(c.fills, partFill{b: b, at: cp.at}) // the runner fills it (fillPart)
		return
	}
	if c.delivered(cp.task) {
		return
	}
	cp.task.waitFrom = cp.at
	c.ready.push(cp.task)
}

// fillPartKeys is the most results of a completed batch that are filled (and, for prefetched
// values, held) at once. A larger batch is filled in parts, the next once the runner has run
// the tasks the last one made runnable (see fillPart).
const fillPartKeys = 64

// partFill is a completed batch whose results are filled in parts: reads[from:] are left.
type partFill struct {
	b    *readBatch
	from int
	at   time.Time
}

// fillPart fills the next part of the oldest batch filled in parts, and delivers its reads.
//
// A completed batch of prefetched values is held until each value's call has run (see fill).
// Filled whole, a batch of 1,400 values (one that waited at the cap, issue 10) held 57% of a
// tier a tenth of the state, and the tier evicted every clean entry to make room, the head of
// a skewed stream with them, each fetched again while its records parked. In parts, what a
// batch holds at once is a part's worth: the runner fills the next part only once it has run
// what the last one made runnable, and those calls have released their values, clean and
// evictable in LRU order again. A failed run delivers the rest at once.
func (c *Controller) fillPart() {
	f := &c.fills[0]
	to := len(f.b.reads)
	if c.err == nil {
		to = min(to, f.from+fillPartKeys)
	}
	c.fill(f.b, f.from, to)
	from := f.from
	f.from = to
	b, at := f.b, f.at
	if to == len(b.reads) {
		c.fills[0] = partFill{}
		c.fills = c.fills[1:]
	}
	c.deliver(b, from, to, at)
	if to == len(b.reads) {
		c.recycleBatch(b)
	}
}

// deliver hands the results b.results[from:to], filled, to their tasks: a prefetching task
// becomes runnable once all its values are in, a suspended one ready to resume.
func (c *Controller) deliver(b *readBatch, from, to int, at time.Time) {
	for i := from; i < to; i++ {
		r := b.reads[i]
		t := r.t
		if c.delivered(t) || b.err != nil {
			continue // its task was aborted, or is aborted with everything else
		}
		if r.prefetch {
			if c.holder != nil {
				t.holds |= 1 << slices.Index(c.prefetch, uint32(r.key.State)) // FillHold held it
			}
			if t.prefetchWait--; t.prefetchWait == 0 {
				c.runnable.push(t)
			}
			continue
		}
		t.fetched = b.results[i]
		t.waitFrom = at
		c.ready.push(t)
	}
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
	if c.ready.len() == 0 {
		return nil
	}
	if c.cfg.ResumeOrder == ResumePriority && c.ready.len() > 1 {
		slices.SortStableFunc(c.ready.live(), func(a, b *task) int {
			switch {
			case a.order < b.order:
				return -1
			case a.order > b.order:
				return 1
			}
			return 0
		})
	}
	return c.ready.pop()
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
	c.hot.resumes++
	if !t.waitFrom.IsZero() {
		c.hot.resumeNanos += int64(time.Since(t.waitFrom))
	}
	if t.inCoro {
		c.resumeCoroutine(t)
		return
	}
	c.resume(self, t)
}
