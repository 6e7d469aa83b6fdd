package scheduler

// The instance pool and its memory budget, and the holds on the prefetched values of tasks
// waiting for an instance.

import (
	"hash/maphash"
	"log/slog"
	"slices"

	"github.com/clink-wasm/clink-wasm/host/state"
)

func (c *Controller) sizePool() error {
	switch w := c.cfg.WaitingMemory; {
	case w == 0:
		c.waitLimit = c.cfg.InstanceMemoryBudget / waitShare
	case w > 0:
		c.waitLimit = min(w, c.cfg.InstanceMemoryBudget)
	}
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
	if c.cfg.instanceOverhead > 0 {
		c.overhead = c.cfg.instanceOverhead
	}
	c.instBytes -= s.cost
	s.cost = c.footprint(s)
	c.instBytes += s.cost
	c.nextCost = s.cost
	c.pool = append(c.pool, s)
	if c.cfg.MaxInFlight > 0 {
		c.maxInFlight = c.cfg.MaxInFlight
	} else {
		// Records waiting for prefetched values or for an instance hold none: the cap
		// bounds the bookkeeping, the budget bounds instances (and waiting records: mayAdmit).
		c.maxInFlight = DefaultMaxInFlight
	}
	return nil
}

// mayAdmit reports whether the runner may admit another task.
//
// The in-flight cap bounds the tasks that hold or wait for an instance, a fetch or a lookup.
// Two kinds of admitted record hold none of these, only their input (the record's bytes and
// the task): one parked behind its key's in-flight task (gate.go), and one that would need a
// fetch while the cap is full, which waits for room under it (waitForCap). Counted by the cap,
// as parked records were, they filled half of it at a tenth of the state hot (issue 10: a head
// key of a skewed stream, evicted and fetched again, parks hundreds of records for a GET's
// wait), and at the cap the runner took no input at all, so records whose values were hot
// waited too. Now, while what the waiting records hold is below waitLimit (WithWaitingMemory:
// by default an eighth of the instance memory budget, which they share with the instances, see
// slotFree), the runner keeps taking input at the cap: a record of a busy key parks, one whose
// prefetched values are hot runs, one that would fetch waits for room. Past that bound the cap
// counts every admitted task again, so the waiting records are bounded either way. The gate's
// order rules do not change (a waiting record keeps its key busy, and later records of the key
// park behind it), nor do barriers (a draining one waits for every admitted task, a capturing
// one captures the waiting records, capture.go; see fetchCap for the cap meanwhile).
//
// The records waiting for room are also bounded by capWaitLookahead caps' worth. Each holds a
// task and a gate entry while it waits, and tens of thousands of them make the gate's map miss
// the cache and the GC scan them: ColdPath/wat-suspend's 40k waiting tasks per 100k records
// (a module that prefetches nothing, so every record it admits at the cap waits) cost 4.9 µs
// of CPU per record against 2.9 µs with 4 MB of waiting memory (issue 11), and a prefetching
// module's cold path (ColdPath/as) 2.4-2.8 µs against 1.6-2.0 with this bound, at the same
// share of the Little's-law bound; BenchmarkDisaggregated's Zipf and uniform figures did not
// move (parked records, which the Zipf case needs, are bounded by their bytes only).
//
// A module that prefetches nothing keeps no record waiting for room at all: each of its records
// may suspend, so one that waited could only take the place of a call that finished, which the
// runner can as well fill from its input then. Admitted early, every such record entered the
// gate and left it, and its task and key went cold while thousands of others waited
// (ColdPath/wat-suspend had ~1,200 records waiting for room on average, one gate entry each,
// and paid for the gate's map and the cold tasks on nearly every record). So at the cap it
// takes a record only if the record would park behind its busy key (the head of the input is
// checked, headParks), and otherwise leaves the input where it is until a call finishes.
//
// Small enough to inline: the all-hits loop (hotRun) asks for every record.
func (c *Controller) mayAdmit() bool {
	return c.admitted < c.maxInFlight || c.mayAdmitAtCap()
}

// mayAdmitAtCap is mayAdmit once the admitted tasks reach the cap.
func (c *Controller) mayAdmitAtCap() bool {
	ok, decided := c.atCap()
	return ok || !decided && c.headParks()
}

// mayAdmitTimer is mayAdmit for a fired timer of key instead of the next input element.
func (c *Controller) mayAdmitTimer(key string) bool {
	if c.admitted < c.maxInFlight {
		return true
	}
	ok, decided := c.atCap()
	if !ok && !decided {
		ok = c.cfg.Order == OrderPerKey && c.keyBusy([]byte(key))
	}
	return ok
}

// atCap is mayAdmit's decision once the admitted tasks reach the cap, as far as it does not
// depend on the task: undecided means that only a task that parks behind its key may come in
// (a module that prefetches nothing, its calls filling the cap).
func (c *Controller) atCap() (ok, decided bool) {
	switch {
	case c.waitBytes >= c.waitLimit:
		return false, true
	case len(c.prefetch) > 0:
		return len(c.capWait) < capWaitLookahead*c.maxInFlight, true
	case c.admitted-c.parked-len(c.capWait) < c.maxInFlight:
		return true, true
	}
	return false, false
}

// headParks reports whether the next input element, taken now, would hold no place under the
// cap: a record whose key is busy (it parks), or no record. With nothing buffered it reports
// true, since reading the next input batch admits nothing (the loop checks its head before
// taking it).
func (c *Controller) headParks() bool {
	if len(c.inbuf) == 0 {
		return true
	}
	el := &c.inbuf[0]
	if el.Kind != ElementRecord {
		return true
	}
	return !el.KeyByWasm && c.cfg.Order == OrderPerKey && c.keyBusy(el.Key)
}

// capWaitLookahead is how many caps' worth of records wait for room under the cap, at most
// (see mayAdmit), for a module that prefetches.
const capWaitLookahead = 4

// overCap reports whether the admitted tasks that count against the cap (all but the waiting
// ones) exceed it: the task being executed, counted among them, must wait for room.
func (c *Controller) overCap() bool {
	return c.admitted-c.parked-len(c.capWait) > c.fetchCap()
}

// fetchCap is the cap on the admitted tasks that count against it: the in-flight cap, but
// while the runner drains (a barrier pending, or the input ended), when it admits nothing
// more, drainCaps caps' worth, so that the records waiting for room (at most
// capWaitLookahead caps' worth, already admitted and held in memory) send their fetches in
// one round instead of one cap's worth per GET wait (see waitForCap).
//
// Not for a module that makes lookups: a record that fetched goes on to its call, which may
// send a lookup, and the lookups outstanding must stay within the cap (an endpoint's queue is
// sized by it: drainCaps caps' worth of lookups at the end of an enrichment job's input
// overflowed one, "endpoint queue full"; TestLookupsWithinCap).
//
// The records a barrier captured instead of draining (capture.go) keep that cap until they have
// run: a drain would have sent their fetches at it, and they are admitted and held already,
// so it holds no more than the drain did (and admission, mayAdmit, is bounded as always).
func (c *Controller) fetchCap() int {
	if c.lookups {
		return c.maxInFlight
	}
	if c.barrier != nil || c.capturedLeft > 0 || c.inputDone && len(c.inbuf) == 0 {
		return drainCaps * c.maxInFlight
	}
	return c.maxInFlight
}

// drainCaps is the in-flight cap during a drain, in caps (see fetchCap).
const drainCaps = capWaitLookahead + 1

// waitForCap queues t, a task that would need a fetch (or, for a module that prefetches
// nothing, could suspend) while the cap is full, until a task that counts against the cap
// completes. Its key is busy meanwhile, so later records of the key park behind it. A task
// whose key a record of the pending batch call has (t arrived after it, and would have joined
// it) parks behind that record instead, as batchAdd would park it. cold says that t's one
// prefetched value was found cold (see awaitPrefetch).
func (c *Controller) waitForCap(t *task, cold bool) {
	if c.pfTask == t {
		c.pfTask = nil
	}
	t.prefetched, t.async = false, true // its prefetched values are checked again when it runs
	if o := c.pendingBatchTask(t.key); o != nil && !t.inGate {
		c.markKeyBusy(o)
		c.park(c.gate.find(c.taskHash(t), t.key), t, false)
		c.flushBatch()
		return
	}
	t.knownCold = cold
	c.markKeyBusy(t)
	c.waitBytes += waitSize(t)
	c.metrics.CapWaits.Add(1)
	c.capWait = append(c.capWait, t)
}

// pendingBatchTask returns the task of the pending batch call (batch.go) with key k, if any.
func (c *Controller) pendingBatchTask(k []byte) *task {
	b := &c.batch
	if len(b.tasks) == 0 || b.running || !b.keys.has(maphash.Bytes(batchSeed, k)) {
		return nil
	}
	for _, o := range b.tasks {
		if string(o.key) == string(k) {
			return o
		}
	}
	return nil
}

// nextCapWaiter takes the first task waiting for room under the cap, if there is room.
func (c *Controller) nextCapWaiter() *task {
	if len(c.capWait) == 0 || c.admitted-c.parked-len(c.capWait) >= c.fetchCap() {
		return nil
	}
	t := c.capWait[0]
	c.capWait[0] = nil
	c.capWait = c.capWait[1:]
	c.waitBytes -= waitSize(t)
	return t
}

// waitShare is the part of the instance memory budget that waiting records may hold by default.
const waitShare = 8

// slotFree reports whether a task could take an instance now: an idle one is pooled, or the
// instance budget allows another beside the spares on their way and the waiting records.
func (c *Controller) slotFree() bool {
	return len(c.pool) > 0 || c.instances == 0 || c.nextCost == 0 ||
		c.instBytes+c.spareBytes+c.waitBytes+c.nextCost <= c.cfg.InstanceMemoryBudget
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
