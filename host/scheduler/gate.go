package scheduler

// The per-key gate: at most one in-flight task per key; later records of a busy key park FIFO.

import (
	"slices"
	"time"
	"unsafe"
)

// gateEntry is a busy key's place in the gate. key is the entry's own copy of the key's bytes,
// written only while the entry is out of the gate (markKeyBusy). inline is the queue's first
// backing array: most keys park one or two records, if any.
type gateEntry struct {
	queue  []*task
	key    []byte
	owner  *task  // the task holding the key (a barrier's capture finds it here, capture.go)
	hash   uint64 // of key, its place in the gate (gateTable)
	inline [2]*task
}

// gateKeyKeep and gateQueueKeep are the largest key copy and queue a pooled gate entry keeps.
const (
	gateKeyKeep   = 256
	gateQueueKeep = 64
)

// submit runs t now if its key is free, or parks it behind the key's in-flight task. A fired
// timer goes to the front of the queue: it belongs to an earlier epoch than any parked record.
func (c *Controller) submit(t *task, front bool) {
	if c.cfg.Order != OrderPerKey {
		if c.cfg.Order == OrderInput && t.kind == kindRecord {
			t.held, t.async = &heldOutput{}, true
			c.reorder = append(c.reorder, t.held)
		}
		c.execute(t)
		return
	}
	// The gate holds only keys whose task suspended: while nothing is suspended or parked (the
	// all-hits path) it is empty and the lookup is skipped (handle checks this before the
	// call).
	if c.gate.n == 0 {
		c.execute(t)
		return
	}
	if g := c.gate.find(c.taskHash(t), t.key); g != nil {
		c.park(g, t, front)
		return
	}
	c.execute(t)
}

// park queues t behind its key's in-flight task. A parked task holds no instance and no IO:
// what it holds is its input (the record's bytes and the task), so it counts against the
// waiting records' memory bound (see mayAdmit), not against the in-flight cap.
func (c *Controller) park(g *gateEntry, t *task, front bool) {
	if front {
		g.queue = slices.Insert(g.queue, 0, t)
	} else {
		g.queue = append(g.queue, t)
	}
	c.parked++
	c.waitBytes += waitSize(t)
	t.waitFrom, t.async = time.Now(), true
}

// waitOverhead is what a waiting record (parked, or waiting for room under the cap) holds
// beyond its key and value bytes: its task, its element of the input batch (which the task's
// key and value alias) and its slot in the queue it waits in.
const waitOverhead = int64(unsafe.Sizeof(task{}) + unsafe.Sizeof(Element{}) + unsafe.Sizeof((*task)(nil)))

func waitSize(t *task) int64 { return int64(len(t.key)+len(t.value)) + waitOverhead }

// markKeyBusy enters t's key into the gate. A task that completes without suspending never
// needs an entry: nothing else runs while it does.
func (c *Controller) markKeyBusy(t *task) {
	if t.inGate || c.cfg.Order != OrderPerKey {
		return
	}
	t.inGate = true
	var g *gateEntry
	if n := len(c.gatePool); n > 0 {
		g = c.gatePool[n-1]
		c.gatePool = c.gatePool[:n-1]
	} else {
		g = &gateEntry{}
		g.queue = g.inline[:0]
	}
	g.key = append(g.key[:0], t.key...)
	g.hash = c.taskHash(t)
	c.gate.insert(g)
	t.gent, g.owner = g, t
}

// taskHash is the gate's hash of t's key, computed once per task.
func (c *Controller) taskHash(t *task) uint64 {
	if !t.hashed {
		t.khash, t.hashed = c.gate.hash(t.key), true
	}
	return t.khash
}

// keyBusy reports whether key's gate entry exists: a record of it would park.
func (c *Controller) keyBusy(key []byte) bool {
	return c.gate.n > 0 && c.gate.find(c.gate.hash(key), key) != nil
}

// keyDone releases t's key: the next parked task of the key becomes runnable, keeping the key.
// A task that never entered the gate (it did not suspend) has nothing to release: that check
// is small enough for the compiler to inline, which saves the all-hits path a call.
func (c *Controller) keyDone(t *task) {
	if t.inGate {
		c.releaseKey(t)
	}
}

func (c *Controller) releaseKey(t *task) {
	t.inGate = false
	g := t.gent
	t.gent = nil
	if len(g.queue) > 0 {
		// A short queue is popped by a copy, not by reslicing: keeping its front keeps its
		// capacity, so the next park behind the key (and the entry's next use, from the gate
		// pool) does not allocate. A long one (a hot key of a skewed stream) is resliced, so a
		// pop stays O(1).
		next := g.queue[0]
		if n := len(g.queue) - 1; n <= 8 {
			copy(g.queue, g.queue[1:])
			g.queue[n] = nil
			g.queue = g.queue[:n]
		} else {
			g.queue[0] = nil
			g.queue = g.queue[1:]
		}
		next.inGate, next.gent, g.owner = true, g, next
		next.holds, t.holds = t.holds, 0 // the values stay held for the key's next call
		c.parked--
		c.waitBytes -= waitSize(next)
		c.metrics.GateWaits.Add(1)
		c.metrics.GateWaitNanos.Add(int64(time.Since(next.waitFrom)))
		c.runnable.push(next)
		return
	}
	c.gate.remove(g)
	g.queue, g.owner = g.queue[:0], nil
	if cap(g.queue) > gateQueueKeep {
		g.queue = g.inline[:0] // a hot key's long queue is not kept for the next key
	}
	if cap(g.key) > gateKeyKeep {
		g.key = nil
	}
	c.gatePool = append(c.gatePool, g)
}
