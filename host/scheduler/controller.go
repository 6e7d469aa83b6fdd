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
//   - In-flight cap: admitted tasks that hold or wait for an instance, a fetch or a lookup
//     (running, suspended, waiting for prefetched values or for an instance) never exceed the
//     cap (WithMaxInFlight). Records parked behind their key, or waiting for room under the cap,
//     hold only their input and are bounded by its bytes (WithWaitingMemory); while they are
//     below that bound the runner takes input at the cap (see mayAdmit), beyond it the cap
//     counts them too and the runner stops pulling input, so backpressure reaches the source.
//   - Instance budget: instances (held only by running or suspended calls) are bounded by the
//     budget (WithInstanceMemoryBudget) at each one's footprint; a task that needs one beyond
//     it waits without one. A record's prefetched values are held hot (state.Holder) until its call has
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
//     and every closed epoch has been released, then captures state: a consistent cut. With
//     WithBarrierCapture it waits only for the calls in progress, and the records admitted but
//     not started go into the checkpoint as its input, replayed first on restore (capture.go).
//   - Read coalescing: pending cold reads go to the backend as one batched Fetch when any of
//     three triggers fires: the batch reaches WithReadBatch keys (default 32); its oldest read
//     has waited WithReadBatchWait (default 1/20 of the observed fetch latency, at least
//     10 µs); or the runner is stuck (every in-flight task waiting, nothing ready, no input it may take). The
//     gate guarantees the keys are for distinct record keys.
//   - Faults: the first failed task is recorded and the run's context cancelled; its key is
//     released and its epoch still advances; then the controller stops admitting, aborts
//     suspended calls, waits for every lookup and fetch still out to deliver, and returns an
//     *OperatorError naming the operator, the record and the key.
//   - Batch calls: for a module that exports clink_process_batch, records of free keys whose
//     prefetched values are hot go to one guest call together (WithCallBatch, batch.go), with
//     the gate's rules unchanged.
//
// See carrier.go for how the runner role moves between goroutines.
//
// # Files
//
//   - controller.go: the Controller, New, Run, the runner loop, input and shutdown;
//   - options.go: Option and its With… constructors, the one place defaults live;
//   - gate.go: the per-key gate; execute.go: running a task's guest call and finishing it, and
//     hotRun, the same for runs of records on the all-hits path in one loop;
//   - instances.go: the instance pool and its memory budget; epochs.go: epochs, timers' release
//     and barriers; ordered.go: outputs held in input order (OrderInput); capture.go: barriers
//     that capture the records not started instead of draining them;
//   - fetch.go: the prefetch check, cold reads and their coalescing; lookups.go: lookups;
//   - completions.go: the hand-back from IO goroutines to the runner, and resuming;
//   - carrier.go and coro.go: how a suspended call waits (carriers, coroutines);
//   - task.go: tasks and the abi.Handler the guest calls; output.go: batched output; metrics.go;
//   - batch.go: batch calls (several records of distinct keys per guest call).
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
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

// LogFunc receives guest log lines. src is nil outside a record or timer call.
type LogFunc func(operator string, level abi.LogLevel, msg []byte, src *Source)

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
	cfg    config
	name   string
	log    *slog.Logger
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
	// WithInputRelease (release.go): the current batch's count, spare counts, and batches
	// waiting for an output flush before their release.
	inRef   *inputRef
	refPool []*inputRef
	retired [][]Element

	maxInFlight    int
	maxInFlightSet atomic.Int64 // a new cap from SetMaxInFlight, applied by the runner (any goroutine writes)
	admitted       int          // tasks admitted and not complete: running, suspended, parked, runnable
	running        int          // tasks holding an instance
	parked         int          // tasks in the gate's queues (admitted, not counted by the cap)
	capWait        []*task      // tasks waiting for room under the cap (waitForCap), FIFO
	waitBytes      int64        // what parked and capWait tasks hold (waitSize summed)
	waitLimit      int64        // the most waitBytes may reach while more are admitted (mayAdmit)
	// lookups: the module may make lookups (it declares endpoints and the run sends them), so
	// the in-flight cap holds during drains too (fetchCap).
	lookups bool
	seq     uint64

	gate     gateTable
	gatePool []*gateEntry
	runnable taskQueue // promoted from the gate, in order

	pool      []*slot
	instances int
	instBytes int64   // footprint of the live instances (slot.cost summed)
	overhead  int64   // wazero's per-instance cost beyond linear memory (sizePool)
	nextCost  int64   // what one more instance is expected to cost
	slotWait  []*task // tasks waiting, without an instance, for one to free
	// Spare instances (spares.go): requested and not yet arrived, the budget they reserve, the
	// size of the last batch, and whether spares are off for the run.
	spareOut   int
	spareBytes int64
	spareBatch int
	noSpares   bool
	holder     state.Holder
	holdBuf    []bool

	epochs    []*epoch // oldest unreleased first; the last is open
	watermark int64    // last watermark forwarded
	lastWM    int64    // last watermark received
	barrier   *uint64
	barrierAt time.Time // when the barrier arrived: its drain starts
	// Barrier capture (capture.go): tasks held back from starting their calls while a barrier
	// waits, the restored input replayed before the input channel, and whether the backend
	// holds an input blob that the next barrier must replace.
	frozen      []*task
	replay      []Element
	inputSet    bool
	drainOnly   bool // this barrier's capture fell back to draining every admitted task
	captureThis bool // the pending barrier captures (WithBarrierCapture's predicate said so)
	// capturedLeft: records the last capture took that have not finished; while there are
	// any, the cap on fetching tasks is the drain's (fetchCap).
	capturedLeft int
	timers       *timerService
	ptimers      *timerService // processing-time timers
	ptUsed       bool          // a processing-time timer was registered or restored: persist them
	ptClosing    bool          // an epoch closed for processing-time timers is not released yet
	ptWake       *time.Timer   // wakes an idle runner at the earliest processing-time timer

	pendingReads []pendingRead
	batchPool    []*readBatch  // delivered batches, for the next ones (recycleBatch)
	fills        []partFill    // completed batches filled in parts (fillPart), oldest first
	pendingSince time.Time     // when the oldest pending read joined the batch
	fetchEWMA    time.Duration // observed fetch latency, for the batch wait
	prefetch     []uint32      // state ids the module prefetches (docs/abi.md, "Fast paths")
	pfTask       *task         // the task whose prefetched values are in pfHot
	pfHot        []pfValue     // hot answers of its prefetch check, valid until the backend is used
	pfNext       int           // the next pfHot answer to hand out (abi gathers in prefetch order)
	maxBatch     int           // pending reads that trigger a Fetch without waiting for the runner to be stuck
	ready        taskQueue     // suspended calls whose value is in, in arrival order
	suspended    []*task       // the tasks suspended inside their calls, each at its task.suspIdx

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
	hotRuns int64    // records hotRun completed (tests read it once Run has returned)
	mode    execMode // direct or coroutine calls (coro.go)
	coSelf  *slot    // the slot whose coroutine is taking input (chain): its next call runs there
	// coEnters counts the calls the runner started in a coroutine; the others a coroutine took
	// itself (chain). Tests read it once Run has returned.
	coEnters int64
	batch    callBatch // records waiting for one batch call (batch.go)
}

// New returns a controller that runs module over backend and writes to sink. Instances are
// created lazily, the first one at once (in Run) so that its memory footprint can size the pool.
func New(module *abi.Module, backend state.Backend, sink Sink, opts ...Option) (*Controller, error) {
	if module == nil || backend == nil || sink == nil {
		return nil, errors.New("scheduler: a module, a backend and a sink are required")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	cfg.Module, cfg.Backend, cfg.Sink = module, backend, sink
	cfg.normalize()
	c := &Controller{
		cfg:       cfg,
		name:      cfg.Module.Name(),
		log:       cfg.Logger.With("operator", cfg.Module.Name()),
		gate:      newGateTable(),
		timers:    newTimerService(cfg.TimerLimit),
		ptimers:   newTimerService(cfg.TimerLimit),
		maxBatch:  cfg.ReadBatch,
		watermark: math.MinInt64,
		lastWM:    math.MinInt64,
		out:       newOutBuffer(cfg.Sink),
	}
	if cfg.InputRelease != nil {
		c.out.flushed = c.releaseRetired
	}
	c.comp.wake = make(chan struct{}, 1)
	c.mode.coro = cfg.ExecMode == ExecCoroutine
	if cfg.Module.HasBatch() {
		c.batch.max = cfg.CallBatch
	}
	c.epochs = []*epoch{{startWM: math.MinInt64}}
	c.lookups = cfg.Lookup != nil && len(cfg.Module.Manifest.Endpoints) > 0
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
	if err := c.restoreInput(); err != nil {
		return nil, err
	}
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
	if c.log.Enabled(ctx, slog.LevelDebug) {
		c.log.LogAttrs(ctx, slog.LevelDebug, "controller started",
			slog.Int("max_in_flight", c.maxInFlight), slog.Int64("instance_bytes", c.nextCost),
			slog.Int64("instance_overhead_bytes", c.overhead), slog.Int64("instance_budget_bytes", c.cfg.InstanceMemoryBudget),
			slog.Bool("synchronous", c.cfg.Synchronous))
	}
	if len(c.replay) > 0 {
		c.inbuf, c.replay = c.replay, nil // restored input goes first (capture.go)
	}
	self := newCarrier()
	c.cur = self
	c.loop(self)
	c.carrierW.Wait()
	if c.log.Enabled(ctx, slog.LevelDebug) {
		s := c.metrics.snapshot()
		c.log.LogAttrs(ctx, slog.LevelDebug, "controller stopped", slog.Int64("records", s.Records),
			slog.Int64("suspensions", s.Suspensions), slog.Int64("peak_instances", s.PeakInstances),
			slog.Int64("instance_waits", s.InstanceWaits), slog.Bool("failed", c.err != nil))
	}
	return c.err
}

// MaxInFlight returns the in-flight cap in force (after Run has started).
func (c *Controller) MaxInFlight() int { return c.maxInFlight }

// SetMaxInFlight changes the in-flight cap of a running controller (a live quota change); safe
// from any goroutine. The runner applies it at its next iteration: under a lower cap no task
// starts a fetch or call that would count against it until the tasks in flight fall below it
// (none is aborted; records may still be admitted to wait, within WithWaitingMemory), a higher
// one admits more once the runner next wakes (a completion or new input). n < 1 is ignored; a Synchronous controller
// keeps its cap of 1.
func (c *Controller) SetMaxInFlight(n int) {
	if n >= 1 {
		c.maxInFlightSet.Store(int64(n))
	}
}

// loop is the runner loop. It runs on whichever carrier holds the runner role; every piece of
// state it keeps between iterations lives in c, so a carrier can pick it up at any hand-off.
func (c *Controller) loop(self *carrier) {
	var comps []completion
	for !c.stopped {
		if len(c.batch.tasks) > 0 {
			c.flushBatch()
		}
		if c.maxInFlightSet.Load() != 0 && !c.cfg.Synchronous { // a load, not a swap, on every pass
			if n := c.maxInFlightSet.Swap(0); n > 0 {
				c.maxInFlight = int(n)
			}
		}
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
			if len(c.fills) > 0 {
				c.fillPart() // delivers the rest of the batch: its tasks are aborted or dropped
				continue
			}
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
		if c.captureThis && c.barrierDrained() {
			// Before anything else: fills, records waiting for room and prefetches keep
			// coming while the barrier waits, and none of them needs to run before it.
			c.completeBarrier()
			continue
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
		if c.runnable.len() > 0 {
			c.execute(c.runnable.pop())
			continue
		}
		if len(c.fills) > 0 {
			c.fillPart()
			continue
		}
		if t := c.nextCapWaiter(); t != nil {
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
			if c.barrierDrained() {
				c.completeBarrier()
				continue
			}
		} else if c.mayAdmit() {
			// The head of a batch read just now is checked as well (headParks).
			buffered := len(c.inbuf) > 0
			if el, ok := c.nextInput(); ok && (buffered || c.mayAdmit()) {
				c.inbuf = c.inbuf[1:]
				c.handle(el)
				c.handleRun()
				continue
			}
		}
		if len(c.pendingReads) > 0 {
			c.flushReads()
			continue
		}
		if c.inputDone && c.admitted == 0 && len(c.epochs) == 1 && c.barrier == nil && c.spareOut == 0 {
			c.shutdown()
			return
		}
		c.wait()
	}
}

// nextInput returns the next input element without blocking, reading the next batch if none
// is buffered; the caller takes it by advancing c.inbuf. The element stays in its input batch,
// which the controller does not modify.
func (c *Controller) nextInput() (*Element, bool) {
	for len(c.inbuf) == 0 {
		if c.inputDone {
			c.inputRead()
			return nil, false
		}
		select {
		case b, ok := <-c.input:
			if !ok {
				c.inputDone = true
				return nil, false
			}
			c.takeInput(b)
		default:
			return nil, false
		}
	}
	return &c.inbuf[0], true
}

// handleRun keeps taking elements from the input batch without a full loop iteration each,
// while nothing else can need the runner: no completion posted, nothing ready, promoted or
// releasable, no barrier, room under the cap. Runs of records that can take the all-hits path
// go through hotRun.
func (c *Controller) handleRun() {
	for c.inputTurn() {
		if c.hotReady() && c.hotRun() {
			continue
		}
		el := &c.inbuf[0]
		c.inbuf = c.inbuf[1:]
		c.handle(el)
	}
}

// inputTurn reports whether the next input element is what the runner would take next: there
// is one buffered, room to admit it, and nothing else can need the runner (handleRun, chain).
func (c *Controller) inputTurn() bool {
	return len(c.inbuf) > 0 && c.mayAdmit() && c.err == nil && c.barrier == nil &&
		c.ready.len() == 0 && c.runnable.len() == 0 && len(c.epochs) == 1 && c.comp.n.Load() == 0
}

// wait blocks until a completion arrives, input can be taken, or ctx is done.
func (c *Controller) wait() {
	c.publish()
	if len(c.inbuf) == 0 {
		c.inputRead() // before the flush, which may then release it (release.go)
	}
	if err := c.out.flush(); err != nil {
		return
	}
	var in <-chan []Element
	if !c.inputDone && c.barrier == nil && c.mayAdmit() && len(c.inbuf) == 0 {
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
	from := time.Now()
	select {
	case <-clock:
	case <-c.comp.wake:
	case b, ok := <-in:
		if !ok {
			c.inputDone = true
		} else {
			c.takeInput(b)
		}
	case <-c.ctx.Done():
	}
	idle := int64(time.Since(from))
	c.metrics.IdleNanos.Add(idle)
	if !c.inputDone && c.barrier == nil && !c.mayAdmit() {
		c.metrics.IdleFullNanos.Add(idle) // it could take no input: the cap and the waiting bound
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
		c.admitInput(t) // before anything can yield the runner role (release.go)
		e := c.epochs[len(c.epochs)-1]
		t.ep, t.wm = e, e.startWM
		e.pending++
		c.admitted++
		if c.gate.n == 0 && c.cfg.Order == OrderPerKey {
			c.execute(t) // no key is busy: submit would run t at once (see execute)
		} else {
			c.submit(t, false)
		}
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
		c.captureThis = c.capturing() && c.cfg.BarrierCapture(id)
	}
}

// fail records the first failure and cancels the run's context, so that the lookups and
// fetches still out give up instead of running until their endpoints are closed.
func (c *Controller) fail(err error) {
	if c.err == nil {
		c.err = err
		// Info, not Warn: the error itself is Run's result, and the caller reports it.
		c.log.LogAttrs(c.ctx, slog.LevelInfo, "run failing: aborting suspended calls",
			slog.String("error", err.Error()), slog.Int("admitted", c.admitted), slog.Int("outstanding", c.outstanding))
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
	c.inputRead()
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
