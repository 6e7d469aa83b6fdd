package scheduler

// Batch calls (docs/abi.md, "Batch calls"; host/abi/batch.go)
//
// A module that exports clink_process_batch can process several records in one export call,
// which saves the per-call cost (the export call, and for a Go guest the runtime's entry and
// the SDK's dispatch). The controller uses it on the all-hits path only:
//
//   - execute puts a record whose key is free and whose prefetched values are hot into the
//     pending batch instead of calling the guest, when the call would run directly (not in a
//     coroutine) and a pooled instance is free;
//   - the batch is flushed, as one call on one instance, when it is full, when a record of a
//     key already in it arrives (that record waits at the gate behind it, and runs next), before
//     any other task runs on an instance (it waits in the runnable queue, its key held), and at
//     the top of every runner-loop iteration. No record waits on a carrier's stack while a
//     batch call runs, where a suspension of that call could let a later record of its key
//     overtake it. So a batch never outlives the admission of one
//     input run: epochs, barriers, timers and the gate see its records as running, exactly
//     like records that are in their own calls.
//   - a record of the batch that suspends (a cold get_async, a lookup) suspends the whole call;
//     every key of the batch is entered into the gate at that moment, so later records of
//     those keys wait for them as they would for a suspended record of their own;
//   - when the call ends, the records are completed in order. A record that faulted is failed
//     (or retried, or dead-lettered) as a record of its own call; the records after it were
//     not applied and run again in their own calls, unless they already changed something
//     (then they fail as well: their effects cannot be undone).

import (
	"errors"
	"hash/maphash"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// DefaultCallBatch is how many records a batch call carries at most, by default.
const DefaultCallBatch = 16

// WithCallBatch sets how many records of distinct keys one batch call may carry, for modules
// that export clink_process_batch (default DefaultCallBatch; 1 turns batch calls off).
func WithCallBatch(n int) Option {
	return optionFunc(func(c *config) { c.CallBatch = max(1, min(n, abi.MaxBatch)) })
}

// errNotApplied fails a record of a batch that ran after a record that faulted, and changed
// something, so it can neither be applied nor run again.
var errNotApplied = errors.New("not applied: an earlier record of its batch call faulted after this record had changed state, timers or outputs")

// callBatch is the pending batch and the slot-side view of a running one.
type callBatch struct {
	max     int
	tasks   []*task
	recs    []abi.BatchRecord
	pf      [][]pfValue // per task: its prefetched values, found hot at admission
	running bool        // flushBatch is completing a batch: execute runs tasks on their own
	keys    keyFilter   // the hashes of the tasks' keys

	calls, records int64 // batch calls made and the records they carried (tests)
	suspends       int64 // suspensions inside batch calls (tests)
}

// batchable reports whether t may join the pending batch instead of running now.
func (c *Controller) batchable(t *task) bool {
	return c.batch.max > 1 && !c.batch.running && !c.mode.coro && t.kind == kindRecord &&
		t.attempts == 0 && t.held == nil && len(c.slotWait) == 0 && len(c.pool) > 0 && c.err == nil
}

// batchAdd puts t, whose prefetch check just found every value hot, into the pending batch.
// It reports false if t must run on its own (after the pending batch, which it flushes).
func (c *Controller) batchAdd(t *task) bool {
	b := &c.batch
	if !c.batchable(t) {
		if len(b.tasks) == 0 || b.running {
			return false
		}
		// t runs after the pending batch. It waits in the runnable queue with its key held:
		// were it to wait on this carrier's stack instead, a suspension in the batch's call
		// would leave it where a later record of its key could overtake it.
		c.markKeyBusy(t)
		c.runnable.push(t)
		c.flushBatch()
		return true
	}
	h := maphash.Bytes(batchSeed, t.key)
	for _, o := range b.tasks {
		if !b.keys.has(h) {
			break // no key of the batch has t's hash: t's key is not in it
		}
		if string(o.key) == string(t.key) {
			// t's key is in the batch: t waits at the gate behind that record, as behind
			// any busy key's task, and the batch runs now. When it is done keyDone makes t
			// runnable, and the runner takes it before more input, so that outputs keep the
			// order of the input on this path, as they do without batches.
			c.markKeyBusy(o)
			c.park(c.gate.find(c.taskHash(t), t.key), t, false)
			c.flushBatch()
			return true
		}
	}
	i := len(b.tasks)
	b.keys.add(h)
	b.tasks = append(b.tasks, t)
	b.recs = append(b.recs, abi.BatchRecord{Key: t.key, Value: t.value, TS: t.ts})
	if len(b.pf) <= i {
		b.pf = append(b.pf, nil)
	}
	if c.pfTask == t {
		b.pf[i] = append(b.pf[i][:0], c.pfHot...)
		c.pfTask = nil
	} else {
		b.pf[i] = b.pf[i][:0]
	}
	if len(b.tasks) == b.max {
		c.flushBatch()
	}
	return true
}

// flushBatch runs the pending batch: one record alone takes the ordinary path, several go to
// one clink_process_batch call.
func (c *Controller) flushBatch() {
	b := &c.batch
	tasks, recs := b.tasks, b.recs
	b.tasks, b.recs, b.keys = nil, nil, keyFilter{}
	b.running = true
	defer func() { b.running = false }()
	if len(tasks) == 1 {
		c.pfTask, c.pfHot, c.pfNext = tasks[0], append(c.pfHot[:0], b.pf[0]...), 0
		c.execute(tasks[0])
		return
	}
	if c.err != nil {
		// The run failed while they waited: they complete without running, as execute
		// completes any task then.
		for _, t := range tasks {
			c.finish(t, nil)
		}
		return
	}
	s, err := c.acquireSlot()
	if err != nil {
		for _, t := range tasks {
			c.finish(t, err)
		}
		return
	}
	// The slot keeps its own copy of the batch: a suspension hands the runner on, and the next
	// holder may start another batch before this call returns.
	s.batch = &slotBatch{tasks: tasks, pf: b.pf}
	b.pf = nil
	for _, t := range tasks {
		t.slot = s
	}
	s.t = tasks[0]
	c.running++
	c.hot.records += int64(len(tasks))
	b.calls++
	b.records += int64(len(tasks))
	done, err := s.inst.ProcessBatch(recs)
	c.running--
	sb := s.batch
	s.batch, s.t = nil, nil
	for _, t := range tasks {
		t.slot = nil
	}
	c.releaseSlot(s)
	if len(c.batch.pf) == 0 {
		c.batch.pf = sb.pf // reuse the per-task value slices
	}
	// The records from the one that failed on run again or fail, and a run again may suspend:
	// their keys are held until each is done, so that no later record of theirs overtakes
	// them meanwhile.
	for _, t := range tasks[min(done, len(tasks)):] {
		c.markKeyBusy(t)
	}
	for i, t := range tasks {
		c.noteExecution(t.suspendedOnce)
		switch {
		case i < done:
			c.finish(t, nil)
		case i == done:
			if c.retryable(t, err) {
				t.attempts++
				t.lookups, t.lookupErr = 0, nil
				c.metrics.RecordRetries.Add(1)
				c.execute(t)
			} else {
				c.finish(t, err)
			}
		case t.effects:
			c.finish(t, errNotApplied)
		default:
			// Never run, or ran and changed nothing: run it on its own. Its key is still
			// its own (no other task of the key ran meanwhile), so per-key order holds.
			t.lookups, t.lookupErr = 0, nil
			t.prefetched = false
			c.execute(t)
		}
	}
	if cap(recs) > cap(c.batch.recs) {
		c.batch.recs = recs[:0]
		c.batch.tasks = tasks[:0]
	}
}

// slotBatch is the batch a slot's instance is running.
type slotBatch struct {
	tasks []*task
	pf    [][]pfValue
}

// SelectRecord implements abi.BatchHandler: the handler serves record i of the slot's batch.
// Its prefetched values answer the frames' reads, as for a record in its own call.
func (s *slot) SelectRecord(i int) {
	t := s.batch.tasks[i]
	s.t = t
	if pf := s.batch.pf[i]; len(pf) > 0 {
		c := s.c
		c.pfTask, c.pfHot, c.pfNext = t, append(c.pfHot[:0], pf...), 0
	}
}

// batchSuspended runs when a record of s's batch suspends: every key of the batch is entered
// into the gate, so that later records of those keys wait, as they would for records in
// calls of their own.
func (c *Controller) batchSuspended(s *slot) {
	c.batch.suspends++
	for _, t := range s.batch.tasks {
		c.markKeyBusy(t)
	}
}

// keyFilter is a 256-bit set of key hashes: the common "this key is not in the batch" answer
// costs a hash and a bit test instead of a comparison with every key of the batch.
type keyFilter [4]uint64

var batchSeed = maphash.MakeSeed()

func (f *keyFilter) add(h uint64)      { f[(h>>6)&3] |= 1 << (h & 63) }
func (f *keyFilter) has(h uint64) bool { return f[(h>>6)&3]&(1<<(h&63)) != 0 }
