// Package scheduler runs one operator subtask: it feeds records to pooled Wasm instances through
// a per-key async execution controller, the Go rendering of the seed engine's
// AsyncExecutionController.
//
// A record's guest call runs until it completes or reaches an async import that cannot answer at
// once (a cold state read, an HTTP lookup). There the call suspends, its instance stays with it,
// and the runner goes on with other records on other instances. When the value arrives the call
// resumes on the runner. Around that, the controller keeps the guarantees of docs/abi.md:
//
//   - Per-key gate: at most one in-flight task per key; later records of a busy key park FIFO
//     and are promoted when the key frees, so same-key reads always see same-key writes.
//   - In-flight cap: admitted tasks (running, suspended, parked, waiting for prefetched values
//     or for an instance) never exceed MaxInFlight; at the cap the runner stops pulling input,
//     so backpressure reaches the source.
//   - Instance budget: instances (held only by running or suspended calls) are bounded by
//     InstanceMemoryBudget at each one's footprint; a task that needs one beyond it waits
//     without one. A record's prefetched values are held hot (state.Holder) until its call has
//     run, so eviction takes only values no admitted record needs.
//   - Epochs: records are tagged with the epoch they arrived in; a watermark closes the epoch.
//     Its release (fire due timers, then forward the watermark) runs only after every task of
//     that epoch and of every earlier epoch has finished, in epoch order. Timers fire as tasks
//     through the same gate, so a timer callback that reads cold state suspends like a record.
//   - Processing-time timers: when the wall clock passes the earliest one, the open epoch is
//     closed as a watermark would close it, but with the watermark unchanged; its release
//     fires the processing-time timers due by then (after every record admitted before), and
//     forwards nothing. While records flow the clock is read once per runner iteration, and
//     only while such timers exist; an idle runner sleeps until the earliest one.
//   - Barrier drain: a checkpoint barrier stops admission until every admitted task has finished
//     and every closed epoch has been released, then captures state: a consistent cut.
//   - Read coalescing: pending cold reads go to the backend as one batched Fetch when any of
//     three triggers fires: the batch reaches ReadBatch keys (default 32); its oldest read has
//     waited ReadBatchWait (default 1/20 of the observed fetch latency, at least 10 µs); or the
//     runner is stuck (every in-flight task waiting, nothing ready, no input it may take). The
//     gate guarantees the keys are for distinct record keys.
//   - Faults: the first failed task is recorded and the run's context cancelled; its key is
//     released and its epoch still advances; then the controller stops admitting, aborts
//     suspended calls, waits for every lookup and fetch still out to deliver, and returns an
//     *OperatorError naming the operator, the record and the key.
//
// See carrier.go for how the runner role moves between goroutines.
package scheduler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// DefaultMaxInFlight is the in-flight cap when neither the configuration nor the guest's memory
// footprint decides otherwise (the seed's kDefaultMaxInFlight).
const DefaultMaxInFlight = 6000

// DefaultInstanceMemoryBudget returns the memory the instance pool may use when the
// configuration does not say: a 64th of the machine's memory (or of the cgroup's limit, if
// lower), between 64 MiB and 1 GiB. On 24 GiB that is 384 MiB: about 2,500 AssemblyScript
// counters at ~150 KiB each, or about 90 Go guests at ~4 MiB.
func DefaultInstanceMemoryBudget() int64 {
	return min(max(systemMemory()/64, 64<<20), 1<<30)
}

// ResumeOrder decides the order in which ready calls resume.
type ResumeOrder uint8

const (
	// ResumeFIFO resumes calls in the order their values arrived.
	ResumeFIFO ResumeOrder = iota
	// ResumePriority resumes ready calls by their order key (lower first), ties in arrival order.
	ResumePriority
)

// Order is the output order guarantee of a pipeline.
type Order uint8

const (
	// OrderPerKey runs records through the per-key gate: each key's records are processed, and
	// their outputs leave, in arrival order; different keys interleave. Keyed state and timers
	// are available. The default.
	OrderPerKey Order = iota
	// OrderInput is for unkeyed enrichment: every record may be in flight at once, whatever its
	// key, and outputs leave in input order (Flink's orderedWait). Keyed state and timers are
	// not available (NOT_ALLOWED): nothing orders two records of a key.
	OrderInput
	// OrderNone is OrderInput without the reordering: outputs leave as records complete
	// (Flink's unorderedWait). Watermarks still never overtake earlier records.
	OrderNone
)

// LookupFunc sends an ABI-framed lookup request through an endpoint and calls done exactly once,
// from any goroutine (or synchronously, for a cached response). A guest-visible failure is an
// abi.Code error; any other error fails the pipeline.
type LookupFunc func(ctx context.Context, endpoint uint32, request []byte, done func(status int, body []byte, err error))

// LogFunc receives guest log lines. src is nil outside a record or timer call.
type LogFunc func(operator string, level abi.LogLevel, msg []byte, src *Source)

// Config configures a Controller.
type Config struct {
	Module  *abi.Module
	Backend state.Backend
	Sink    Sink
	Lookup  LookupFunc // nil: lookups fail with LOOKUP_UNAVAILABLE
	Log     LogFunc

	// MaxInFlight caps admitted tasks (running, suspended, parked, waiting for prefetched
	// values or for an instance). Default DefaultMaxInFlight.
	MaxInFlight int
	// InstanceMemoryBudget bounds the host memory of the instance pool: each instance counts
	// its linear memory as Go holds it (append growth keeps up to a quarter more) plus
	// wazero's own per-instance structures, measured on the first instance. A task that needs
	// an instance when the pool is empty and another would exceed the budget waits, without
	// one, until one is released. Default DefaultInstanceMemoryBudget().
	InstanceMemoryBudget int64

	// Cold reads are coalesced into batched Fetches (set NoCoalesce to issue each read at
	// once). A batch goes out when it reaches ReadBatch keys (default 32), or earlier when the
	// runner is stuck: every in-flight task waiting, nothing ready, no input it may take.
	// Waiting for bigger batches would hold every miss back by the time it takes to fill one,
	// and leave a single batch in flight; 32 keeps tens of batches overlapping at 512 in
	// flight while each remote request still serves many keys. MaxReadBatch caps what a stuck
	// runner sends at once (default 4096).
	//
	// A batch also goes out once its oldest read has waited ReadBatchWait: by default 1/20 of
	// the observed fetch latency (at least 10 µs), so a miss never waits long for company
	// relative to the fetch it will make anyway.
	NoCoalesce    bool
	ReadBatch     int
	MaxReadBatch  int
	ReadBatchWait time.Duration

	// Synchronous makes every cold read and lookup block the runner: the baseline the async
	// path is measured against. It implies MaxInFlight 1.
	Synchronous bool

	ResumeOrder ResumeOrder

	// Order is the output order guarantee (default OrderPerKey).
	Order Order

	// ExecMode chooses between direct and coroutine guest calls (default: adaptive).
	ExecMode ExecMode

	// TimerLimit bounds timers per key (default 65536).
	TimerLimit int

	// OnBarrier runs on the runner once a barrier has drained, after timers are saved to the
	// backend's operator state: capture state there.
	OnBarrier func(id uint64) error

	// Describe names a record position in errors, e.g. "input line 42". Default "record #N".
	Describe func(pos int64) string
}

// ElementKind distinguishes the elements of the input stream.
type ElementKind uint8

const (
	ElementRecord ElementKind = iota
	ElementWatermark
	ElementBarrier
)

// Element is one input: a record, a watermark or a checkpoint barrier.
type Element struct {
	Kind      ElementKind
	Key       []byte
	Value     []byte
	TS        int64 // record timestamp, or the watermark
	Pos       int64 // source position of a record
	CheckID   uint64
	KeyByWasm bool // key the record with the guest's clink_key
}

// OperatorError is the failure of an operator on one record or timer.
type OperatorError struct {
	Operator string
	Where    string // "input line 42", "timer at 1700000000000"
	Key      []byte
	TS       int64
	Err      error
	// Lookup is the last failed lookup of the failing call, if any: the guest saw only its
	// code, so the report names the reason (for a refusal, the rule that refused it).
	Lookup error
}

func (e *OperatorError) Error() string {
	var f *abi.Fault
	detail := e.Err.Error()
	if errors.As(e.Err, &f) {
		detail = f.Detail()
	}
	if e.Lookup != nil {
		detail += " (its last lookup failed: " + e.Lookup.Error() + ")"
	}
	return fmt.Sprintf("operator %q failed at %s (key %q, timestamp %d): %s", e.Operator, e.Where, e.Key, e.TS, detail)
}

func (e *OperatorError) Unwrap() error { return e.Err }

// ErrAborted is what a suspended call sees when the controller aborts it.
var ErrAborted = errors.New("scheduler: call aborted because the pipeline is stopping")

// Controller is the async execution controller of one operator subtask.
type Controller struct {
	cfg    Config
	name   string
	ctx    context.Context // Run's, as given (the loop polls it: a plain Background costs nothing)
	ioCtx  context.Context // what lookups are sent with: ctx, cancelled on the first failure
	cancel context.CancelCauseFunc
	input  <-chan []Element

	// Everything below is owned by the runner role (see carrier.go) unless noted.
	cur      *carrier
	idle     []*carrier
	carrierW sync.WaitGroup
	stopped  bool

	inbuf     []Element
	inputDone bool

	maxInFlight int
	admitted    int // tasks admitted and not complete: running, suspended, parked, runnable
	running     int // tasks holding an instance
	parked      int
	seq         uint64

	gate     map[string]*gateEntry
	gatePool []*gateEntry
	runnable []*task // promoted from the gate, in order

	pool      []*slot
	instances int
	instBytes int64   // footprint of the live instances (slot.cost summed)
	overhead  int64   // wazero's per-instance cost beyond linear memory (sizePool)
	nextCost  int64   // what one more instance is expected to cost
	slotWait  []*task // tasks waiting, without an instance, for one to free
	holder    state.Holder
	holdBuf   []bool

	epochs    []*epoch // oldest unreleased first; the last is open
	watermark int64    // last watermark forwarded
	lastWM    int64    // last watermark received
	barrier   *uint64
	barrierAt time.Time // when the barrier arrived: its drain starts
	timers    *timerService
	ptimers   *timerService // processing-time timers
	ptUsed    bool          // a processing-time timer was registered or restored: persist them
	ptClosing bool          // an epoch closed for processing-time timers is not released yet
	ptWake    *time.Timer   // wakes an idle runner at the earliest processing-time timer

	pendingReads []pendingRead
	pendingSince time.Time     // when the oldest pending read joined the batch
	fetchEWMA    time.Duration // observed fetch latency, for the batch wait
	prefetch     []uint32      // state ids the module prefetches (docs/abi.md, "Fast paths")
	pfTask       *task         // the task whose prefetched values are in pfHot
	pfHot        []pfValue     // hot answers of its prefetch check, valid until the backend is used
	pfNext       int           // the next pfHot answer to hand out (abi gathers in prefetch order)
	maxBatch     int           // pending reads that trigger a Fetch without waiting for the runner to be stuck
	ready        []*task
	suspended    map[*task]struct{}

	comp completions // the only cross-goroutine surface
	// outstanding counts async operations (lookups sent, batched Fetches issued) whose
	// completion the runner has not yet taken. Run returns only once it is zero.
	outstanding int

	out     *outBuffer
	reorder []*heldOutput // OrderInput: records in input order with their held outputs
	err     error

	taskPool []*task

	metrics metrics
	hot     hotCounts
	mode    execMode // direct or coroutine calls (coro.go)
}

type gateEntry struct{ queue []*task }

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

// completions is the hand-back from IO goroutines to the runner.
type completions struct {
	n    atomic.Int32 // len(q), readable without the lock: the loop checks it every iteration
	mu   sync.Mutex
	q    []completion
	wake chan struct{} // cap 1
}

type completion struct {
	batch *readBatch
	task  *task // a finished lookup
	at    time.Time
}

type readBatch struct {
	reads   []pendingRead
	results []state.Fetched
	err     error
	issued  time.Time
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

// New returns a controller for cfg. Instances are created lazily, the first one at once so that
// its memory footprint can size the pool.
func New(cfg Config) (*Controller, error) {
	if cfg.Module == nil || cfg.Backend == nil || cfg.Sink == nil {
		return nil, errors.New("scheduler: Module, Backend and Sink are required")
	}
	if cfg.TimerLimit <= 0 {
		cfg.TimerLimit = 65536
	}
	if cfg.MaxReadBatch <= 0 {
		cfg.MaxReadBatch = 4096
	}
	if cfg.ReadBatch <= 0 {
		cfg.ReadBatch = 32
	}
	cfg.ReadBatch = min(cfg.ReadBatch, cfg.MaxReadBatch)
	if cfg.InstanceMemoryBudget <= 0 {
		cfg.InstanceMemoryBudget = DefaultInstanceMemoryBudget()
	}
	if cfg.Describe == nil {
		cfg.Describe = func(pos int64) string { return fmt.Sprintf("record #%d", pos) }
	}
	c := &Controller{
		cfg:       cfg,
		name:      cfg.Module.Name(),
		gate:      make(map[string]*gateEntry),
		suspended: make(map[*task]struct{}),
		timers:    newTimerService(cfg.TimerLimit),
		ptimers:   newTimerService(cfg.TimerLimit),
		maxBatch:  cfg.ReadBatch,
		watermark: math.MinInt64,
		lastWM:    math.MinInt64,
		out:       newOutBuffer(cfg.Sink),
	}
	c.comp.wake = make(chan struct{}, 1)
	c.mode.coro = cfg.ExecMode == ExecCoroutine
	c.epochs = []*epoch{{startWM: math.MinInt64}}
	if !cfg.Synchronous && cfg.Order == OrderPerKey {
		c.prefetch = cfg.Module.Manifest.PrefetchIDs()
		c.holder, _ = cfg.Backend.(state.Holder)
	}
	if err := c.timers.unmarshal(cfg.Backend.OperatorState(timersStateName)); err != nil {
		return nil, err
	}
	if err := c.ptimers.unmarshal(cfg.Backend.OperatorState(procTimersStateName)); err != nil {
		return nil, err
	}
	c.ptUsed = c.ptimers.len() > 0
	return c, nil
}

// Metrics returns a snapshot of the controller's metrics. It may be called from any goroutine
// while the controller runs; hot-path counts (records, hits) are published in bulk, whenever the
// runner waits and at the end.
func (c *Controller) Metrics() Snapshot { return c.metrics.snapshot() }

// Run processes input until it is closed and every task has completed, or until the first
// failure or ctx's cancellation. The last watermark a bounded source sends should be
// math.MaxInt64 so that every timer fires. Run may be called once.
func (c *Controller) Run(ctx context.Context, input <-chan []Element) error {
	c.ctx = ctx
	c.ioCtx, c.cancel = context.WithCancelCause(ctx)
	defer c.cancel(nil)
	c.input = input
	if err := c.sizePool(); err != nil {
		return err
	}
	self := newCarrier()
	c.cur = self
	c.loop(self)
	c.carrierW.Wait()
	return c.err
}

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
	// Everything the first instantiation allocated, linear memory included: an upper bound
	// (it counts the garbage instantiation leaves, and whatever other goroutines allocated
	// meanwhile), which errs on the side of fewer instances.
	mem := int64(s.inst.MemoryBytes())
	c.overhead = max(heapAllocated()-before-mem, 32<<10)
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
		c.instBytes+c.nextCost <= c.cfg.InstanceMemoryBudget
}

// footprint is what instance s costs the host: its linear memory with the spare capacity Go's
// append growth leaves (wazero grows memory by appending), plus wazero's own structures.
func (c *Controller) footprint(s *slot) int64 {
	return int64(s.inst.MemoryBytes())*5/4 + c.overhead
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
	c.metrics.InstanceWaits.Add(1)
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

// MaxInFlight returns the in-flight cap in force (after Run has started).
func (c *Controller) MaxInFlight() int { return c.maxInFlight }

// loop is the runner loop. It runs on whichever carrier holds the runner role; every piece of
// state it keeps between iterations lives in c, so a carrier can pick it up at any hand-off.
func (c *Controller) loop(self *carrier) {
	var comps []completion
	for !c.stopped {
		comps = c.comp.take(comps[:0])
		for _, cp := range comps {
			c.complete(cp)
		}
		if c.err == nil {
			if err := c.ctx.Err(); err != nil {
				c.fail(fmt.Errorf("pipeline cancelled: %w", context.Cause(c.ctx)))
			} else if c.out.err != nil {
				c.fail(c.out.err)
			}
		}
		if c.err != nil {
			if t := c.anySuspended(); t != nil {
				t.aborted = ErrAborted
				c.resumeTask(self, t)
				continue
			}
			if c.outstanding > 0 {
				// The run's context is cancelled: what is still out delivers soon. Run
				// returns only after it has, so nothing writes into the controller later.
				<-c.comp.wake
				continue
			}
			c.shutdown()
			return
		}
		if t := c.nextReady(); t != nil {
			c.resumeTask(self, t)
			continue
		}
		if len(c.slotWait) > 0 && c.slotFree() {
			t := c.slotWait[0]
			c.slotWait[0] = nil
			c.slotWait = c.slotWait[1:]
			c.execute(t)
			continue
		}
		if len(c.runnable) > 0 {
			t := c.runnable[0]
			c.runnable[0] = nil
			c.runnable = c.runnable[1:]
			c.execute(t)
			continue
		}
		if c.releaseStep() {
			continue
		}
		if c.ptUsed && c.procTimersDue() {
			continue
		}
		if c.barrier != nil {
			if c.admitted == 0 && len(c.epochs) == 1 {
				c.completeBarrier()
				continue
			}
		} else if c.admitted < c.maxInFlight {
			if el, ok := c.nextInput(); ok {
				c.handle(el)
				// While nothing else can need the runner (no completion posted, nothing
				// ready, promoted or releasable, no barrier, room under the cap), keep
				// taking records from the batch without a full loop iteration each.
				for len(c.inbuf) > 0 && c.admitted < c.maxInFlight && c.err == nil && c.barrier == nil &&
					len(c.ready) == 0 && len(c.runnable) == 0 && len(c.epochs) == 1 && c.comp.n.Load() == 0 {
					el := &c.inbuf[0]
					c.inbuf = c.inbuf[1:]
					c.handle(el)
				}
				continue
			}
		}
		if len(c.pendingReads) > 0 {
			c.flushReads()
			continue
		}
		if c.inputDone && c.admitted == 0 && len(c.epochs) == 1 && c.barrier == nil {
			c.shutdown()
			return
		}
		c.wait()
	}
}

// nextInput takes the next input element without blocking. The element stays in its input
// batch, which the controller does not modify.
func (c *Controller) nextInput() (*Element, bool) {
	for len(c.inbuf) == 0 {
		if c.inputDone {
			return nil, false
		}
		select {
		case b, ok := <-c.input:
			if !ok {
				c.inputDone = true
				return nil, false
			}
			c.inbuf = b
		default:
			return nil, false
		}
	}
	el := &c.inbuf[0]
	c.inbuf = c.inbuf[1:]
	return el, true
}

// wait blocks until a completion arrives, input can be taken, or ctx is done.
func (c *Controller) wait() {
	c.publish()
	if err := c.out.flush(); err != nil {
		return
	}
	var in <-chan []Element
	if !c.inputDone && c.barrier == nil && c.admitted < c.maxInFlight && len(c.inbuf) == 0 {
		in = c.input
	}
	var clock <-chan time.Time
	if c.ptUsed && !c.ptClosing && c.barrier == nil {
		if next, ok := c.ptimers.next(); ok {
			d := time.Duration(next-time.Now().UnixMilli()) * time.Millisecond
			if c.ptWake == nil {
				c.ptWake = time.NewTimer(d)
			} else {
				c.ptWake.Reset(d)
			}
			clock = c.ptWake.C
			defer c.ptWake.Stop()
		}
	}
	select {
	case <-clock:
	case <-c.comp.wake:
	case b, ok := <-in:
		if !ok {
			c.inputDone = true
		} else {
			c.inbuf = b
		}
	case <-c.ctx.Done():
	}
}

func (c *Controller) handle(el *Element) {
	switch el.Kind {
	case ElementRecord:
		t := c.newTask()
		t.kind = kindRecord
		t.key, t.value, t.ts, t.pos = el.Key, el.Value, el.TS, el.Pos
		if el.KeyByWasm {
			k, err := c.keyOf(el.Value)
			if err != nil {
				c.fail(&OperatorError{Operator: c.name, Where: c.cfg.Describe(el.Pos), TS: el.TS, Err: err})
				c.freeTask(t)
				return
			}
			t.key = k
		}
		e := c.epochs[len(c.epochs)-1]
		t.ep, t.wm = e, e.startWM
		e.pending++
		c.admitted++
		c.submit(t, false)
	case ElementWatermark:
		if el.TS <= c.lastWM {
			return // watermarks never move backwards
		}
		c.lastWM = el.TS
		e := c.epochs[len(c.epochs)-1]
		e.closed, e.closeWM = true, el.TS
		c.epochs = append(c.epochs, &epoch{startWM: el.TS})
	case ElementBarrier:
		id := el.CheckID
		c.barrier = &id
		c.barrierAt = time.Now()
	}
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
	// all-hits path) it is empty and the lookup is skipped.
	if len(c.gate) == 0 {
		c.execute(t)
		return
	}
	if g, ok := c.gate[string(t.key)]; ok {
		if front {
			g.queue = slices.Insert(g.queue, 0, t)
		} else {
			g.queue = append(g.queue, t)
		}
		c.parked++
		t.waitFrom, t.async = time.Now(), true
		return
	}
	c.execute(t)
}

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
	}
	c.gate[string(t.key)] = g
}

// keyDone releases t's key: the next parked task of the key becomes runnable, keeping the key.
func (c *Controller) keyDone(t *task) {
	if !t.inGate {
		return
	}
	t.inGate = false
	g := c.gate[string(t.key)]
	if len(g.queue) > 0 {
		next := g.queue[0]
		g.queue[0] = nil
		g.queue = g.queue[1:]
		next.inGate = true
		next.holds, t.holds = t.holds, 0 // the values stay held for the key's next call
		c.parked--
		c.metrics.GateWaits.Add(1)
		c.metrics.GateWaitNanos.Add(int64(time.Since(next.waitFrom)))
		c.runnable = append(c.runnable, next)
		return
	}
	delete(c.gate, string(t.key))
	g.queue = g.queue[:0]
	c.gatePool = append(c.gatePool, g)
}

// execute runs t's guest call on the current carrier. If the call suspends, this carrier parks
// inside it and returns here, holding the runner role again, once the call has completed.
func (c *Controller) execute(t *task) {
	if c.err != nil {
		c.finish(t, nil)
		return
	}
	if len(c.prefetch) > 0 && !t.prefetched && c.awaitPrefetch(t) {
		return // runnable again once its prefetched values are loaded
	}
	if (len(c.pool) == 0 || len(c.slotWait) > 0) && (!c.slotFree() || len(c.slotWait) > 0 && !t.slotWaited) {
		c.waitForSlot(t)
		return
	}
	s, err := c.acquireSlot()
	if err != nil {
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
		c.metrics.CoroutineCalls.Add(1)
		if c.runInCoroutine(s) {
			c.afterCall(t, s, s.co.err)
		}
		return // otherwise suspended inside the coroutine: resumeTask continues it
	}
	c.afterCall(t, s, c.callGuest(s))
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
	c.finish(t, err)
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
		c.fail(&OperatorError{Operator: c.name, Where: where, Key: bytes.Clone(t.key), TS: t.ts, Err: err, Lookup: t.lookupErr})
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
	c.freeTask(t)
}

// heldOutput holds a record's outputs in OrderInput mode until every earlier record is done.
type heldOutput struct {
	done bool
	outs []Output // owned copies
}

func (h *heldOutput) add(key, value []byte, ts int64, src Source) {
	kv := make([]byte, 0, len(key)+len(value)+len(src.Key))
	kv = append(append(append(kv, key...), value...), src.Key...)
	src.Key = kv[len(key)+len(value):]
	h.outs = append(h.outs, Output{Kind: OutputData, Key: kv[:len(key):len(key)], Value: kv[len(key) : len(key)+len(value)], TS: ts, Src: src})
}

// releaseHeld passes on the outputs of the longest prefix of completed records.
func (c *Controller) releaseHeld() {
	n := 0
	for ; n < len(c.reorder) && c.reorder[n].done; n++ {
		for _, o := range c.reorder[n].outs {
			if err := c.out.emit(o.Key, o.Value, o.TS, o.Src); err != nil {
				c.fail(err)
			}
		}
		c.reorder[n] = nil
	}
	c.reorder = c.reorder[n:]
}

// fail records the first failure and cancels the run's context, so that the lookups and
// fetches still out give up instead of running until their endpoints are closed.
func (c *Controller) fail(err error) {
	if c.err == nil {
		c.err = err
		if c.cancel != nil {
			c.cancel(err)
		}
		// Reads not yet sent never will be: their tasks are aborted or dropped with the rest.
		for _, r := range c.pendingReads {
			r.t.io--
		}
		clear(c.pendingReads)
		c.pendingReads = c.pendingReads[:0]
	}
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
		if c.admitted >= c.maxInFlight {
			return false
		}
		te := e.due[0]
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
	c.barrier = nil
	drained := time.Now()
	c.metrics.BarrierDrainNanos.Add(int64(drained.Sub(c.barrierAt)))
	c.saveTimers()
	if c.cfg.OnBarrier != nil {
		err := c.cfg.OnBarrier(id)
		c.metrics.BarrierCaptureNanos.Add(int64(time.Since(drained)))
		if err != nil {
			c.fail(fmt.Errorf("checkpoint %d: %w", id, err))
			return
		}
	}
	c.metrics.Barriers.Add(1)
	if err := c.out.mark(OutputBarrier, int64(id)); err != nil {
		c.fail(err)
	}
}

// SaveTimers stores the timer queue in the backend's operator state; used before a final
// savepoint when no barrier passed.
func (c *Controller) SaveTimers() { c.saveTimers() }

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

// --- async imports ---

// queueRead adds a cold key to the pending batch and sends the batch when it is full or its
// oldest read has waited long enough (see Config.ReadBatchWait).
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
// t waits without an instance, and goes to the runnable queue when the loads complete.
func (c *Controller) awaitPrefetch(t *task) bool {
	t.prefetched = true
	if len(c.prefetch) == 1 {
		// The common case, without the loop's bookkeeping.
		k := state.Key{State: state.StateID(c.prefetch[0]), Record: t.key}
		v, found, hot := c.cfg.Backend.Get(k)
		if hot {
			c.pfHot = append(c.pfHot[:0], pfValue{state: c.prefetch[0], value: v, found: found})
			c.pfTask, c.pfNext = t, 0
			return false
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
	c.pendingReads = nil
	keys := make([]state.Key, len(reads))
	for i, r := range reads {
		keys[i] = r.key
	}
	n := int64(len(reads))
	c.metrics.ReadBatches.Add(1)
	c.metrics.ReadBatchKeys.Add(n)
	if n > c.metrics.MaxReadBatch.Load() {
		c.metrics.MaxReadBatch.Store(n)
	}
	b := &readBatch{reads: reads, issued: time.Now()}
	c.outstanding++
	c.cfg.Backend.Fetch(keys, func(res []state.Fetched, err error) {
		if err == nil && len(res) != len(reads) {
			err = fmt.Errorf("state backend returned %d results for %d keys", len(res), len(reads))
		}
		b.results, b.err = res, err
		c.comp.post(completion{batch: b, at: time.Now()})
	})
}

// complete installs a completion on the runner and queues its tasks for resumption.
func (c *Controller) complete(cp completion) {
	c.outstanding--
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

// fill installs a batch's results in the backend. Through a Holder it skips the backend's guard
// against stale fetches, because the gate rules out what the guard is for: a task holds its key
// from the moment Get found it cold until its call has run, so nothing wrote the key in between
// (under heavy eviction the guard refuses every fetch that waited long, and each refused
// prefetch becomes a suspension inside the call, which holds an instance). It also holds the
// prefetched values until their calls have run.
func (c *Controller) fill(b *readBatch) {
	if c.holder == nil {
		c.cfg.Backend.Fill(b.results)
		return
	}
	hold := c.holdBuf[:0]
	for _, r := range b.reads {
		i := slices.Index(c.prefetch, uint32(r.key.State))
		hold = append(hold, r.prefetch && i >= 0 && i < 64 && r.t.holds&(1<<i) == 0 && !r.t.orphan)
	}
	c.holder.FillHold(b.results, hold)
	c.holdBuf = hold[:0]
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
	for t := range c.suspended {
		return t
	}
	return nil
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

// lookupAsync sends a lookup and suspends t until it answers (or returns at once for a response
// the lookup layer answers synchronously, e.g. from its cache).
func (c *Controller) lookupAsync(t *task, endpoint uint32, req []byte) (int, []byte, error) {
	c.metrics.Lookups.Add(1)
	t.async = true
	if c.cfg.Synchronous {
		status, body, err := c.lookupBlocking(endpoint, req)
		if err != nil {
			t.lookupErr = err
		}
		return status, body, err
	}
	t.done.Store(0)
	t.io++
	c.outstanding++
	c.cfg.Lookup(c.ioCtx, endpoint, bytes.Clone(req), func(status int, body []byte, err error) {
		t.lookup = lookupResult{status: status, body: body, err: err}
		if t.done.CompareAndSwap(0, 2) {
			return // answered before the caller suspended: it reads t.lookup directly
		}
		c.comp.post(completion{task: t, at: time.Now()})
	})
	if t.done.CompareAndSwap(0, 1) {
		c.suspend(t)
		if t.aborted != nil {
			return 0, nil, t.aborted
		}
	} else {
		t.io-- // delivered already, and no completion was posted
		c.outstanding--
	}
	r := t.lookup
	t.lookup = lookupResult{}
	if r.err != nil {
		t.lookupErr = r.err
	}
	return r.status, r.body, r.err
}

func (c *Controller) lookupBlocking(endpoint uint32, req []byte) (int, []byte, error) {
	ch := make(chan lookupResult, 1)
	c.cfg.Lookup(c.ioCtx, endpoint, bytes.Clone(req), func(status int, body []byte, err error) {
		ch <- lookupResult{status, body, err}
	})
	r := <-ch
	return r.status, r.body, r.err
}

// --- instances ---

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
	return c.newSlot()
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
	if cost := c.footprint(s); cost != s.cost { // its memory grew
		c.instBytes += cost - s.cost
		s.cost = cost
	}
	c.pool = append(c.pool, s)
}

// shutdown retires every instance (clink_close on a clean finish), flushes output and wakes the
// idle carriers so they exit.
func (c *Controller) shutdown() {
	ctx := context.WithoutCancel(c.ctx)
	for _, s := range c.pool {
		s.stopCoroutine()
		if c.err == nil {
			if err := s.inst.Close(ctx); err != nil {
				c.fail(&OperatorError{Operator: c.name, Where: "clink_close", Err: err})
			}
		} else {
			_ = s.inst.Close(ctx)
		}
		c.instances--
		c.instBytes -= s.cost
	}
	c.pool = nil
	if err := c.out.flush(); err != nil {
		c.fail(err)
	}
	c.publish()
	c.stopped = true
	for _, idle := range c.idle {
		idle.wake <- struct{}{}
	}
	c.idle = nil
}

func (c *Controller) newTask() *task {
	c.seq++
	if n := len(c.taskPool); n > 0 {
		t := c.taskPool[n-1]
		c.taskPool = c.taskPool[:n-1]
		t.seq = c.seq
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
