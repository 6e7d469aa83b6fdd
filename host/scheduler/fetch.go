package scheduler

// Cold reads: the prefetch check, suspension on a cold read, and coalescing reads into batched
// Fetches.

import (
	"bytes"
	"fmt"
	"slices"
	"time"

	"github.com/clink-wasm/clink-wasm/host/state"
)

// readBatch is one batched Fetch: its reads, from the moment it is sent until the last of
// them is delivered. Delivered batches are pooled with their slices and their done callback
// (recycleBatch), so that a batch costs no allocation: three per batch had been a third of the
// suspension path's allocations, issue 11.
type readBatch struct {
	c       *Controller
	reads   []pendingRead
	keys    []state.Key // the keys given to Fetch, which does not keep them past its done
	results []state.Fetched
	err     error
	issued  time.Time
	done    func([]state.Fetched, error) // b.fetched, made once per batch struct
}

// fetched is the batch's Fetch completion, on any goroutine: it posts the batch to the runner.
// The runner leaves b.reads alone until it takes the completion.
func (b *readBatch) fetched(res []state.Fetched, err error) {
	if err == nil && len(res) != len(b.reads) {
		err = fmt.Errorf("state backend returned %d results for %d keys", len(res), len(b.reads))
	}
	b.results, b.err = res, err
	b.c.comp.post(completion{batch: b, at: time.Now()})
}

// pfValue is a hot prefetched value found by the prefetch check. value aliases backend memory.
type pfValue struct {
	state uint32
	value []byte
	found bool
}

// pendingRead is one cold key waiting for the next batched Fetch: either the read of a task
// suspended inside its guest call, or a prefetched value a task needs before its call starts.
type pendingRead struct {
	t        *task
	key      state.Key
	prefetch bool
}

// queueRead adds a cold key to the pending batch and sends the batch when it is full or its
// oldest read has waited long enough (see WithReadBatchWait).
func (c *Controller) queueRead(r pendingRead) {
	if len(c.pendingReads) == 0 {
		c.pendingSince = time.Now()
	}
	r.t.io++
	c.pendingReads = append(c.pendingReads, r)
	if c.cfg.NoCoalesce || len(c.pendingReads) >= c.maxBatch || time.Since(c.pendingSince) >= c.batchWait() {
		c.flushReads()
	}
}

func (c *Controller) batchWait() time.Duration {
	if c.cfg.ReadBatchWait > 0 {
		return c.cfg.ReadBatchWait
	}
	return max(c.fetchEWMA/20, 10*time.Microsecond)
}

// awaitPrefetch checks that t's prefetched values are hot. If some are cold it queues their
// loads, enters t's key in the gate (later records of the key park behind it) and reports true:
// t waits without an instance, and goes to the runnable queue when the loads complete. If the
// cap is full (t was admitted beyond it, see mayAdmit), t waits for room instead, its loads
// not yet queued.
func (c *Controller) awaitPrefetch(t *task) bool {
	t.prefetched = true
	if len(c.prefetch) == 1 {
		// The common case, without the loop's bookkeeping.
		k := state.Key{State: state.StateID(c.prefetch[0]), Record: t.key}
		if !t.knownCold {
			v, found, hot := c.cfg.Backend.Get(k)
			if hot {
				c.pfHot = append(c.pfHot[:0], pfValue{state: c.prefetch[0], value: v, found: found})
				c.pfTask, c.pfNext = t, 0
				return false
			}
		}
		// (A task known cold was found so just before, or before it waited for room under the
		// cap, its key busy since: nothing filled it, and asking again would count a second
		// miss.)
		t.knownCold = false
		if c.overCap() {
			c.waitForCap(t, true)
			return true
		}
		t.prefetchWait, t.async = 1, true
		c.metrics.PrefetchWaits.Add(1)
		c.markKeyBusy(t)
		c.queueRead(pendingRead{t: t, key: k, prefetch: true})
		return true
	}
	c.pfHot = c.pfHot[:0]
	for _, id := range c.prefetch {
		k := state.Key{State: state.StateID(id), Record: t.key}
		v, found, hot := c.cfg.Backend.Get(k)
		if !hot {
			if t.prefetchWait == 0 && c.overCap() {
				c.waitForCap(t, false) // before any of its loads is queued
				return true
			}
			t.io++
			c.pendingReads = append(c.pendingReads, pendingRead{t: t, key: k, prefetch: true})
			if len(c.pendingReads) == 1 {
				c.pendingSince = time.Now()
			}
			t.prefetchWait++
			t.async = true
			continue
		}
		c.pfHot = append(c.pfHot, pfValue{state: id, value: v, found: found})
	}
	if t.prefetchWait == 0 {
		// All hot: the call starts right away, and the frames can take these answers instead
		// of asking the backend again (nothing touches it in between).
		c.pfTask, c.pfNext = t, 0
		return false
	}
	c.metrics.PrefetchWaits.Add(1)
	c.markKeyBusy(t)
	if c.cfg.NoCoalesce || len(c.pendingReads) >= c.maxBatch {
		c.flushReads()
	}
	return true
}

// readCold suspends t until k has been loaded. It runs on the holder, inside t's guest call.
func (c *Controller) readCold(t *task, k state.Key) ([]byte, bool, error) {
	t.async = true
	t.readKey = state.Key{State: k.State, Record: t.key, Entry: bytes.Clone(k.Entry)}
	if c.cfg.Synchronous {
		ch := make(chan readBatch, 1)
		c.cfg.Backend.Fetch([]state.Key{t.readKey}, func(res []state.Fetched, err error) {
			ch <- readBatch{results: res, err: err}
		})
		b := <-ch
		if b.err != nil {
			return nil, false, fmt.Errorf("state read: %w", b.err)
		}
		c.cfg.Backend.Fill(b.results)
		return b.results[0].Value, b.results[0].Found, nil
	}
	c.queueRead(pendingRead{t: t, key: t.readKey})
	c.suspend(t)
	if t.aborted != nil {
		return nil, false, t.aborted
	}
	v, found := t.fetched.Value, t.fetched.Found
	t.fetched = state.Fetched{}
	return v, found, nil
}

// flushReads issues every pending cold read as one batched Fetch.
func (c *Controller) flushReads() {
	reads := c.pendingReads
	var b *readBatch
	if n := len(c.batchPool); n > 0 {
		b = c.batchPool[n-1]
		c.batchPool[n-1] = nil
		c.batchPool = c.batchPool[:n-1]
	} else {
		b = &readBatch{c: c}
		b.done = b.fetched
	}
	// The batch keeps reads until it is delivered. The next batch starts in the reads slice
	// of the delivered batch taken from the pool, or at this one's size instead of growing
	// from nothing (growslice was 5% of the suspension path's CPU, and a new slice per batch
	// 3.7% of the runner's with its share of the collector's work).
	if b.reads != nil {
		c.pendingReads = b.reads[:0]
	} else {
		c.pendingReads = make([]pendingRead, 0, len(reads))
	}
	b.reads = reads
	b.keys = b.keys[:0]
	for _, r := range reads {
		b.keys = append(b.keys, r.key)
	}
	n := int64(len(reads))
	c.metrics.ReadBatches.Add(1)
	c.metrics.ReadBatchKeys.Add(n)
	if n > c.metrics.MaxReadBatch.Load() {
		c.metrics.MaxReadBatch.Store(n)
	}
	b.issued = time.Now()
	c.outstanding++
	c.cfg.Backend.Fetch(b.keys, b.done)
}

// recycleBatch takes back a batch delivered to the last of its tasks, for a later batch
// (flushReads). Nothing reads it after that: fill and deliver are done, the backend called
// done and keeps neither the keys nor the callback, and the completion was taken.
func (c *Controller) recycleBatch(b *readBatch) {
	b.results, b.err = nil, nil
	if len(c.batchPool) >= batchPoolKeep {
		b.reads, b.keys = nil, nil
		return
	}
	// Drop the tasks and keys; keep no slice of a batch far larger than usual.
	clear(b.reads)
	clear(b.keys)
	b.reads, b.keys = b.reads[:0], b.keys[:0]
	if cap(b.reads) > readsKeepCap {
		b.reads, b.keys = nil, nil
	}
	c.batchPool = append(c.batchPool, b)
}

// batchPoolKeep and readsKeepCap bound what recycleBatch keeps: the batches of a fetch's
// latency at the suspension path's rate (2.5 ms at ~14 batches), and no slice of a batch far
// larger than usual (one a drain or a barrier made).
const (
	batchPoolKeep = 32
	readsKeepCap  = 1024
)

// fill installs a batch's results in the backend. Through a Holder it skips the backend's guard
// against stale fetches, because the gate rules out what the guard is for: a task holds its key
// from the moment Get found it cold until its call has run, so nothing wrote the key in between
// (under heavy eviction the guard refuses every fetch that waited long, and each refused
// prefetch becomes a suspension inside the call, which holds an instance). It also holds the
// prefetched values until their calls have run.
//
// It fills b.results[from:to] (see fillPart).
func (c *Controller) fill(b *readBatch, from, to int) {
	if c.holder == nil {
		c.cfg.Backend.Fill(b.results[from:to])
		return
	}
	hold := c.holdBuf[:0]
	for _, r := range b.reads[from:to] {
		i := slices.Index(c.prefetch, uint32(r.key.State))
		hold = append(hold, r.prefetch && i >= 0 && i < 64 && r.t.holds&(1<<i) == 0 && !r.t.orphan)
	}
	c.holder.FillHold(b.results[from:to], hold)
	c.holdBuf = hold[:0]
}
