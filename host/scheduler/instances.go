package scheduler

// The instance pool and its memory budget, and the holds on the prefetched values of tasks
// waiting for an instance.

import (
	"log/slog"
	"slices"

	"github.com/clink-wasm/clink-wasm/host/state"
)

func (c *Controller) sizePool() error {
	if c.cfg.Synchronous {
		c.maxInFlight = 1
		return nil
	}
	before := heapAllocated()
	s, err := c.newSlot()
	if err != nil {
		return err
	}
	c.overhead = instanceOverhead(heapAllocated()-before, int64(s.inst.MemoryBytes()), s.inst.MemoryOnHeap())
	c.instBytes -= s.cost
	s.cost = c.footprint(s)
	c.instBytes += s.cost
	c.nextCost = s.cost
	c.pool = append(c.pool, s)
	if c.cfg.MaxInFlight > 0 {
		c.maxInFlight = c.cfg.MaxInFlight
	} else {
		// Records waiting for prefetched values, parked behind their key or waiting for an
		// instance hold none: the cap bounds the bookkeeping, the budget bounds instances.
		c.maxInFlight = DefaultMaxInFlight
	}
	return nil
}

// slotFree reports whether a task could take an instance now: an idle one is pooled, or the
// instance budget allows another.
func (c *Controller) slotFree() bool {
	return len(c.pool) > 0 || c.instances == 0 || c.nextCost == 0 ||
		c.instBytes+c.spareBytes+c.nextCost <= c.cfg.InstanceMemoryBudget
}

// minInstanceOverhead is the least an instance is assumed to cost beyond its linear memory.
const minInstanceOverhead = 32 << 10

// instanceOverhead is wazero's per-instance cost beyond linear memory, from the heap growth
// of the first instantiation: everything it allocated, an upper bound (it counts the garbage
// instantiation leaves, and whatever other goroutines allocated meanwhile), which errs on the
// side of fewer instances. Linear memory is part of that growth only when it lives on the Go
// heap; in its own mapping (the default on Linux) it is not, and subtracting it anyway would
// cancel the overhead of a guest with a large memory (a Go guest: megabytes of linear memory
// against about as much of wazero's structures) down to the floor.
func instanceOverhead(heapGrowth, memBytes int64, memOnHeap bool) int64 {
	if memOnHeap {
		heapGrowth -= memBytes
	}
	return max(heapGrowth, minInstanceOverhead)
}

// footprint is what instance s costs the host: its linear memory, plus wazero's own structures.
// Memory on the Go heap also carries the spare capacity append growth leaves (up to a quarter);
// a mapped memory costs what it has grown to, no more.
func (c *Controller) footprint(s *slot) int64 {
	s.mem = s.inst.MemoryBytes()
	mem := int64(s.mem)
	if s.inst.MemoryOnHeap() {
		mem = mem * 5 / 4
	}
	return mem + c.overhead
}

// waitForSlot queues t until an instance frees. Its prefetched values are held meanwhile, so
// that it still finds them hot when it runs.
func (c *Controller) waitForSlot(t *task) {
	if c.pfTask == t {
		c.pfTask = nil // the stashed answers are valid only until the backend is used again
	}
	for _, id := range c.prefetch {
		c.hold(t, state.Key{State: state.StateID(id), Record: t.key})
	}
	t.slotWaited, t.async = true, true
	// The key is busy while t waits: a later record of the key parks behind t in the gate.
	// (Waiting in slotWait behind t is not enough: t may take an instance and suspend, and the
	// later record would then take the next free instance and run beside it.)
	c.markKeyBusy(t)
	if c.metrics.InstanceWaits.Add(1) == 1 {
		c.log.LogAttrs(c.ctx, slog.LevelInfo, "instance budget reached: records wait for an instance",
			slog.Int("instances", c.instances), slog.Int64("instance_bytes", c.instBytes),
			slog.Int64("budget_bytes", c.cfg.InstanceMemoryBudget))
	}
	c.slotWait = append(c.slotWait, t)
}

// hold asks the backend to keep k, a prefetched value of t, hot until t's call has run (or the
// key's next call, see keyDone): otherwise a burst of other fills could evict it and the call
// would read it again, cold, inside the guest, holding an instance while it waits.
func (c *Controller) hold(t *task, k state.Key) {
	if c.holder == nil {
		return
	}
	i := slices.Index(c.prefetch, uint32(k.State))
	if i < 0 || i >= 64 || t.holds&(1<<i) != 0 {
		return
	}
	if c.holder.Hold(k) {
		t.holds |= 1 << i
	}
}

func (c *Controller) releaseHolds(t *task) {
	for i := 0; t.holds != 0 && i < len(c.prefetch); i++ {
		if t.holds&(1<<i) != 0 {
			t.holds &^= 1 << i
			c.holder.Release(state.Key{State: state.StateID(c.prefetch[i]), Record: t.key})
		}
	}
}

func (c *Controller) newSlot() (*slot, error) {
	s := &slot{c: c}
	inst, err := c.cfg.Module.Instantiate(c.ctx, s)
	if err != nil {
		return nil, err
	}
	s.inst = inst
	s.cost = c.footprint(s)
	c.instBytes += s.cost
	c.instances++
	if int64(c.instances) > c.metrics.PeakInstances.Load() {
		c.metrics.PeakInstances.Store(int64(c.instances))
	}
	return s, nil
}

func (c *Controller) acquireSlot() (*slot, error) {
	if n := len(c.pool); n > 0 {
		s := c.pool[n-1]
		c.pool = c.pool[:n-1]
		return s, nil
	}
	s, err := c.newSlot()
	if err == nil {
		c.wantSpares() // demand outgrew the pool: make the next few off the runner
	}
	return s, err
}

// releaseSlot returns an instance to the pool, or discards it after a fault.
func (c *Controller) releaseSlot(s *slot) {
	if s.inst.Broken() {
		s.stopCoroutine()
		_ = s.inst.Close(c.ctx)
		c.instances--
		c.instBytes -= s.cost
		return
	}
	if s.inst.MemoryBytes() != s.mem { // its memory grew
		cost := c.footprint(s)
		c.instBytes += cost - s.cost
		s.cost = cost
	}
	c.pool = append(c.pool, s)
}
