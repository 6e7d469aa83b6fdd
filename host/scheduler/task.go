package scheduler

import (
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/state"
)

type taskKind uint8

const (
	kindRecord taskKind = iota
	kindTimer
	kindProcTimer // a processing-time timer
)

// task is one record or fired timer on its way through the controller.
type task struct {
	kind  taskKind
	key   []byte // owned
	value []byte // owned (records)
	ts    int64
	pos   int64 // source position (records), for error reports
	seq   uint64
	ep    *epoch
	wm    int64 // the watermark this task sees
	// effects: the call changed something (state, timers, an output); a failed call without
	// any may be handed to OnRecordFailure instead of failing the run.
	effects  bool
	attempts int // calls that faulted and were retried (WithRecordRetries)
	io       int // async operations out that can still deliver to the task (see freeTask)
	// The fields above and the next group are what the all-hits path touches (hotRun): kept
	// together, they share the struct's first cache lines.

	slot      *slot    // instance running the task, while in flight
	carrier   *carrier // carrier parked in the task's guest call, while suspended
	suspended bool
	suspIdx   int  // its index in Controller.suspended while suspended
	inGate    bool // the task's key has an entry in the gate
	hashed    bool // khash is the gate's hash of key (taskHash)
	khash     uint64
	gent      *gateEntry  // that entry, while inGate: releaseKey needs no lookup to find it
	held      *heldOutput // OrderInput: where the task's outputs wait for earlier records

	async         bool // it used a field of the slow paths below: reset clears them
	inCoro        bool // its call runs inside its slot's coroutine (coro.go)
	suspendedOnce bool // its call suspended at least once

	prefetched   bool   // its prefetched values were checked (and, if cold, loaded)
	prefetchWait int    // prefetched values still loading
	holds        uint64 // bit i: the backend holds its value of prefetch state i (see holdPrefetched)
	slotWaited   bool   // it waited for an instance (the instance budget) and may now take one
	knownCold    bool   // its (one) prefetched value was found cold, and nothing can have filled it since

	// Result of the async operation the task is suspended on. Written by the holder (state
	// reads are installed on the runner) or, for lookups, by an IO goroutine before the
	// completion is posted; read by the task's carrier after it resumes.
	fetched state.Fetched
	readKey state.Key
	lookup  lookupResult
	// lookupErr is the last failed lookup of the call (for the report if the call fails).
	lookupErr error
	lookups   int // lookups the call made so far (LookupCall.Index)
	aborted   error
	order     int64 // resume priority, lower first (ResumePriority)
	waitFrom  time.Time
	done      atomic.Int32 // lookup completion state, see Lookup
	// lookupDone is the done callback of the task's lookups, made once per task struct
	// (bound to it and its controller, whose pool it stays in) instead of once per lookup.
	lookupDone func(status int, body []byte, err error)

	orphan bool // finished (aborted) while io > 0: pooled when the last one delivers

	captured bool // a barrier captured it (capture.go): Controller.capturedLeft counts it until it finishes

	in *inputRef // the input batch a record came from, with WithInputRelease (release.go)
}

// reset clears t for reuse. (A plain `*t = task{}` would copy the atomic.) A task that stayed
// on the fast path (no suspension, lookup, wait or held output) touched only the first group
// of fields: clearing just those keeps the all-hits path cheap.
func (t *task) reset() {
	t.key, t.value, t.ep, t.slot = nil, nil, nil, nil
	t.prefetched, t.inCoro, t.inGate, t.hashed = false, false, false, false
	if !t.async {
		return
	}
	t.async = false
	t.carrier, t.suspended, t.held = nil, false, nil
	t.fetched, t.readKey, t.lookup, t.lookupErr, t.aborted, t.order, t.waitFrom = state.Fetched{}, state.Key{}, lookupResult{}, nil, nil, 0, time.Time{}
	t.done.Store(0)
	t.prefetchWait, t.suspendedOnce, t.slotWaited, t.knownCold = 0, false, false, false
	t.captured = false
	t.lookups = 0
}

type lookupResult struct {
	status int
	body   []byte
	err    error
}

// slot is a pooled instance and the abi.Handler that serves its imports for the task it runs.
type slot struct {
	c    *Controller
	inst *abi.Instance
	t    *task
	co   coState // the slot's coroutine, created on first use (coro.go)
	cost int64   // its footprint as last accounted (Controller.footprint)
	mem  uint64  // its linear memory's size when cost was computed
	// setup: a spare being instantiated off the runner (spares.go); its handler calls that
	// need the runner are forwarded to it.
	setup bool
	batch *slotBatch // the batch call the instance is running (batch.go)
}

var _ abi.Handler = (*slot)(nil)

func (s *slot) key(stateID uint32, entry []byte) state.Key {
	return state.Key{State: state.StateID(stateID), Record: s.t.key, Entry: entry}
}

// Get implements abi.Handler: a hot hit answers at once; a miss suspends the call.
func (s *slot) Get(stateID uint32, entry []byte) ([]byte, bool, error) {
	if s.t == nil || s.c.cfg.Order != OrderPerKey {
		return nil, false, abi.NotAllowed
	}
	if c := s.c; c.pfTask == s.t && len(entry) == 0 {
		// The frames of the prefetch check that just ran for this task: host/abi gathers them
		// in prefetch order, before any other backend call of the task.
		if i := c.pfNext; i < len(c.pfHot) && c.pfHot[i].state == stateID {
			c.pfNext++
			if c.pfNext == len(c.pfHot) {
				c.pfTask = nil
			}
			c.hot.hits++
			return c.pfHot[i].value, c.pfHot[i].found, nil
		}
		c.pfTask = nil // not the expected read: answer from the backend from now on
	}
	k := s.key(stateID, entry)
	v, found, hot := s.c.cfg.Backend.Get(k)
	if hot {
		s.c.hot.hits++
		return v, found, nil
	}
	s.c.hot.misses++
	return s.c.readCold(s.t, k)
}

// Put implements abi.Handler.
func (s *slot) Put(stateID uint32, entry, value []byte) error {
	if s.t == nil || s.c.cfg.Order != OrderPerKey {
		return abi.NotAllowed
	}
	s.c.pfTask = nil
	s.t.effects = true
	s.c.cfg.Backend.Put(s.key(stateID, entry), value)
	return nil
}

// Delete implements abi.Handler.
func (s *slot) Delete(stateID uint32, entry []byte) error {
	if s.t == nil || s.c.cfg.Order != OrderPerKey {
		return abi.NotAllowed
	}
	s.c.pfTask = nil
	s.t.effects = true
	s.c.cfg.Backend.Delete(s.key(stateID, entry))
	return nil
}

// Emit implements abi.Handler.
func (s *slot) Emit(key, value []byte) error {
	if s.setup {
		return abi.NotAllowed // host/abi refuses emits during setup already
	}
	// A flush inside the call may block on a backpressured sink: add runs it as s.inst.Blocking,
	// so that the call gives its CPU share's running slot up meanwhile and the operators it
	// waits for (the tenant's own, downstream) can run.
	t := s.t
	if t == nil { // clink_close: the last watermark (docs/abi.md, emit)
		out, err := s.c.out.add(key, value, s.inst)
		if err != nil {
			return err
		}
		out.TS, out.Src = s.c.watermark, Source{}
		return nil
	}
	t.effects = true
	if t.held != nil {
		t.held.add(key, value, t.ts, Source{Pos: t.pos, Key: t.key, Timer: t.kind != kindRecord, TS: t.ts})
		return nil
	}
	// outBuffer.emit, with the source written straight into the output (see emit).
	out, err := s.c.out.add(key, value, s.inst)
	if err != nil {
		return err
	}
	out.TS = t.ts
	out.Src.Pos, out.Src.Key, out.Src.TS, out.Src.Timer = t.pos, t.key, t.ts, t.kind != kindRecord
	return nil
}

// RegisterTimer implements abi.Handler.
func (s *slot) RegisterTimer(ts int64) error {
	if s.t == nil || s.c.cfg.Order != OrderPerKey {
		return abi.NotAllowed
	}
	s.t.effects = true
	return s.c.timers.register(s.t.key, ts)
}

// DeleteTimer implements abi.Handler.
func (s *slot) DeleteTimer(ts int64) error {
	if s.t == nil || s.c.cfg.Order != OrderPerKey {
		return abi.NotAllowed
	}
	s.t.effects = true
	s.c.timers.remove(s.t.key, ts)
	return nil
}

// RegisterProcessingTimer implements abi.ProcessingTimerHandler.
func (s *slot) RegisterProcessingTimer(ts int64) error {
	if s.t == nil || s.c.cfg.Order != OrderPerKey {
		return abi.NotAllowed
	}
	s.c.ptUsed = true
	s.t.effects = true
	return s.c.ptimers.register(s.t.key, ts)
}

// DeleteProcessingTimer implements abi.ProcessingTimerHandler.
func (s *slot) DeleteProcessingTimer(ts int64) error {
	if s.t == nil || s.c.cfg.Order != OrderPerKey {
		return abi.NotAllowed
	}
	s.t.effects = true
	s.c.ptimers.remove(s.t.key, ts)
	return nil
}

// Watermark implements abi.Handler.
func (s *slot) Watermark() int64 {
	if s.setup {
		var wm int64
		s.onRunner(func() { wm = s.c.watermark })
		return wm
	}
	if s.t == nil {
		return s.c.watermark
	}
	return s.t.wm
}

// Lookup implements abi.Handler: it suspends the call until the endpoint answers.
func (s *slot) Lookup(endpoint uint32, req []byte) (int, []byte, error) {
	if s.c.cfg.Lookup == nil {
		return 0, nil, abi.LookupUnavailable
	}
	if s.setup {
		return s.setupLookup(endpoint, req)
	}
	t := s.t
	if t == nil {
		// clink_open / clink_close: no task to suspend; block this carrier (rare, and the
		// runner has nothing else it could safely do while an instance is being set up).
		return s.c.lookupBlocking(s.c.ioCtx, endpoint, req)
	}
	return s.c.lookupAsync(t, endpoint, req)
}

// Log implements abi.Handler.
func (s *slot) Log(level abi.LogLevel, msg []byte) {
	if s.setup && s.c.cfg.Log != nil {
		s.onRunner(func() { s.c.cfg.Log(s.c.name, level, msg, nil) })
		return
	}
	if s.c.cfg.Log != nil {
		var src *Source
		if t := s.t; t != nil {
			src = &Source{Pos: t.pos, Key: t.key, Timer: t.kind != kindRecord, TS: t.ts}
		}
		s.c.cfg.Log(s.c.name, level, msg, src)
	}
}

// SetResumeOrder implements abi.Handler.
func (s *slot) SetResumeOrder(order int64) {
	if s.t != nil {
		s.t.async = true
		s.t.order = order
	}
}

// taskQueue is a FIFO of tasks that keeps its backing array: a pop advances the head, and
// the queue starts again at the array's front whenever it empties, or moves its live part
// there when an append would otherwise grow it. (The ready and runnable queues had been
// slices popped by reslicing, whose appends reallocated once the consumed front had used up
// the array: an allocation every few suspended records, issue 11.)
type taskQueue struct {
	q    []*task
	head int
}

func (tq *taskQueue) len() int { return len(tq.q) - tq.head }

func (tq *taskQueue) push(t *task) {
	if len(tq.q) == cap(tq.q) && tq.head > 0 {
		tq.compact()
	}
	tq.q = append(tq.q, t)
}

func (tq *taskQueue) pushAll(ts []*task) {
	if len(tq.q)+len(ts) > cap(tq.q) && tq.head > 0 {
		tq.compact()
	}
	tq.q = append(tq.q, ts...)
}

// compact moves the queued tasks to the array's front.
func (tq *taskQueue) compact() {
	n := copy(tq.q, tq.q[tq.head:])
	clear(tq.q[n:])
	tq.q, tq.head = tq.q[:n], 0
}

// pop takes the task at the front; the queue must not be empty.
func (tq *taskQueue) pop() *task {
	t := tq.q[tq.head]
	tq.q[tq.head] = nil
	if tq.head++; tq.head == len(tq.q) {
		tq.q, tq.head = tq.q[:0], 0
	}
	return t
}

// live returns the queued tasks, front first, for a reorder in place.
func (tq *taskQueue) live() []*task { return tq.q[tq.head:] }
