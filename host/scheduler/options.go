package scheduler

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// Option configures a Controller (see New). Options are applied in order, so a later one wins;
// defaults live in defaultConfig and nowhere else, and New checks the result once. The same
// style as host/state and host/lookup.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// config holds every Controller setting.
type config struct {
	Module  *abi.Module
	Backend state.Backend
	Sink    Sink
	Lookup  LookupFunc // nil: lookups fail with LOOKUP_UNAVAILABLE
	Log     LogFunc    // guest log lines; nil drops them
	Logger  *slog.Logger

	MaxInFlight          int   // 0: DefaultMaxInFlight
	InstanceMemoryBudget int64 // 0: DefaultInstanceMemoryBudget()
	WaitingMemory        int64 // 0: InstanceMemoryBudget/8; < 0: none (see WithWaitingMemory)
	NoCoalesce           bool
	ReadBatch            int
	MaxReadBatch         int
	ReadBatchWait        time.Duration // 0: adaptive (see WithReadBatchWait)
	Synchronous          bool
	ResumeOrder          ResumeOrder
	Order                Order
	ExecMode             ExecMode
	NoSpares             bool

	// instanceOverhead, when > 0, replaces the overhead measured from the first instantiation's
	// heap growth (which counts whatever else allocated meanwhile): tests of the budget set it.
	instanceOverhead int64
	TimerLimit       int
	OnBarrier        func(id uint64) error
	BarrierCapture   func(id uint64) bool // capture.go
	LookupContext    func(ctx context.Context, call LookupCall) context.Context
	OnRecordFailure  func(RecordFailure) error
	RecordRetries    int
	Describe         func(pos int64) string
	CallBatch        int // records per batch call (batch.go)

	InputRelease func([]Element) // release.go
}

func defaultConfig() config {
	return config{
		Logger:       slog.New(slog.DiscardHandler),
		ReadBatch:    32,
		MaxReadBatch: 4096,
		TimerLimit:   65536,
		CallBatch:    DefaultCallBatch,
		Describe:     func(pos int64) string { return fmt.Sprintf("record #%d", pos) },
	}
}

// normalize replaces the values an option may set to "use the default" (zero, negative, nil)
// by the default, and clamps what depends on another setting.
func (c *config) normalize() {
	d := defaultConfig()
	if c.Logger == nil {
		c.Logger = d.Logger
	}
	if c.TimerLimit <= 0 {
		c.TimerLimit = d.TimerLimit
	}
	if c.MaxReadBatch <= 0 {
		c.MaxReadBatch = d.MaxReadBatch
	}
	if c.ReadBatch <= 0 {
		c.ReadBatch = d.ReadBatch
	}
	c.ReadBatch = min(c.ReadBatch, c.MaxReadBatch)
	if c.InstanceMemoryBudget <= 0 {
		c.InstanceMemoryBudget = DefaultInstanceMemoryBudget()
	}
	if c.MaxInFlight < 0 {
		c.MaxInFlight = 0
	}
	if c.Describe == nil {
		c.Describe = d.Describe
	}
}

// WithLookup sets how lookups are sent. Without it, every lookup fails with LOOKUP_UNAVAILABLE.
func WithLookup(f LookupFunc) Option { return optionFunc(func(c *config) { c.Lookup = f }) }

// WithGuestLog sets where the guest's log lines go (clink_log). Without it they are dropped.
func WithGuestLog(f LogFunc) Option { return optionFunc(func(c *config) { c.Log = f }) }

// WithLogger sets where the controller itself logs (the default discards): its sizing at the
// start of a run, the first failure, and the moments the instance budget starts holding tasks
// back. Nothing is logged per record. Lines carry an "operator" attribute.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.Logger = l }) }

// WithMaxInFlight caps the admitted tasks that hold or wait for an instance, a fetch or a
// lookup (running, suspended, waiting for prefetched values or for an instance). 0 means
// DefaultMaxInFlight. Records parked behind a busy key, or waiting for room under the cap,
// count against WithWaitingMemory instead; once that is full they count against the cap too,
// and at the cap the runner stops taking input, so backpressure reaches the source.
func WithMaxInFlight(n int) Option { return optionFunc(func(c *config) { c.MaxInFlight = n }) }

// WithInstanceMemoryBudget bounds the host memory of the instance pool: each instance counts
// its linear memory plus wazero's own per-instance structures (measured on the first
// instance). A task that needs an instance when the pool is empty and another would exceed
// the budget waits, without one, until one is released. 0 means DefaultInstanceMemoryBudget().
func WithInstanceMemoryBudget(n int64) Option {
	return optionFunc(func(c *config) { c.InstanceMemoryBudget = n })
}

// WithWaitingMemory bounds what the records that wait without counting against the in-flight
// cap may hold: records parked behind their key's in-flight task, and records that would need a
// fetch while the cap is full, waiting for room under it. Each holds its input (key, value,
// task: about 600 bytes beside the record's own). While they hold less than n, the runner
// keeps taking input at the cap (records whose values are hot run; see Controller's package
// doc; at most four caps' worth wait for room); at n the cap counts every admitted task, as it does for n < 0 (no record waits beyond
// the cap). The bytes are part of the instance memory budget (an instance is made only if it
// fits beside them), and n is clamped to it. 0 means an eighth of the instance memory budget.
func WithWaitingMemory(n int64) Option { return optionFunc(func(c *config) { c.WaitingMemory = n }) }

// WithCoalescing turns read coalescing on (the default) or off (each cold read is sent alone).
//
// Pending cold reads go out as one batched Fetch when the batch reaches WithReadBatch keys, or
// earlier when the runner is stuck: every in-flight task waiting, nothing ready, no input it
// may take. Waiting for bigger batches would hold every miss back by the time it takes to fill
// one, and leave a single batch in flight; 32 keeps tens of batches overlapping at 512 in
// flight while each remote request still serves many keys.
func WithCoalescing(on bool) Option { return optionFunc(func(c *config) { c.NoCoalesce = !on }) }

// WithReadBatch sets the batch size that sends pending cold reads at once (default 32), and
// the most a stuck runner sends in one Fetch (default 4096). 0 keeps a default.
func WithReadBatch(n, maxBatch int) Option {
	return optionFunc(func(c *config) { c.ReadBatch, c.MaxReadBatch = n, maxBatch })
}

// WithReadBatchWait sends a batch once its oldest read has waited d. By default (0) that is
// 1/20 of the observed fetch latency (at least 10 µs), so a miss never waits long for company
// relative to the fetch it will make anyway.
func WithReadBatchWait(d time.Duration) Option {
	return optionFunc(func(c *config) { c.ReadBatchWait = d })
}

// WithSynchronous makes every cold read and lookup block the runner: the baseline the async
// path is measured against, and what replay uses. It implies an in-flight cap of 1.
func WithSynchronous(on bool) Option { return optionFunc(func(c *config) { c.Synchronous = on }) }

// WithResumeOrder sets the order in which ready calls resume (default ResumeFIFO).
func WithResumeOrder(o ResumeOrder) Option { return optionFunc(func(c *config) { c.ResumeOrder = o }) }

// WithOrder sets the output order guarantee (default OrderPerKey).
func WithOrder(o Order) Option { return optionFunc(func(c *config) { c.Order = o }) }

// WithExecMode chooses between direct and coroutine guest calls (default ExecAuto).
func WithExecMode(m ExecMode) Option { return optionFunc(func(c *config) { c.ExecMode = m }) }

// WithSpareInstances turns spare instances on (the default) or off. With them, when the pool
// runs dry the controller instantiates a few instances ahead of demand, off the runner
// (spares.go); each runs _initialize and clink_open when made, and clink_close at the end, even
// if no record reaches it. Off: instances are made only when a record needs one, on the runner,
// so how many there are (and how many clink_open and clink_close calls run) follows from the
// input and its timing alone (what a deterministic test run wants).
func WithSpareInstances(on bool) Option { return optionFunc(func(c *config) { c.NoSpares = !on }) }

// WithTimerLimit bounds timers per key (default 65536).
func WithTimerLimit(n int) Option { return optionFunc(func(c *config) { c.TimerLimit = n }) }

// WithOnBarrier sets what runs on the runner once a barrier has drained, after timers are
// saved to the backend's operator state: capture state there. An error fails the run.
func WithOnBarrier(f func(id uint64) error) Option {
	return optionFunc(func(c *config) { c.OnBarrier = f })
}

// LookupCall names one lookup of a guest call: the record (or timer) that made it and the
// call's index among that record's lookups. Key and Value are valid only during the
// LookupContext callback.
type LookupCall struct {
	Timer      bool
	Pos, TS    int64 // the record's source position; a timer's time
	Key, Value []byte
	Index      int // 0 for the record's first lookup
}

// WithLookupContext sets a function that derives the context of each lookup from the
// controller's, given the call that makes it (for example an idempotency key: see
// host/lookup.WithIdempotencyKey). Default: none.
func WithLookupContext(f func(ctx context.Context, call LookupCall) context.Context) Option {
	return optionFunc(func(c *config) { c.LookupContext = f })
}

// RecordFailure is a record whose guest call faulted without changing anything: no state
// written, no timer changed, no output emitted. Key and Value are valid only during the
// OnRecordFailure callback.
type RecordFailure struct {
	Pos, TS    int64
	Key, Value []byte
	Attempts   int            // calls made, the retries included
	Err        *OperatorError // names the operator, the record and the fault
}

// WithRecordRetries runs a record whose guest call faulted without changing anything (see
// RecordFailure) again, up to n times, on another instance and before later records of its
// key, before the fault counts (OnRecordFailure, or the run's failure). Default 0.
func WithRecordRetries(n int) Option {
	return optionFunc(func(c *config) { c.RecordRetries = max(n, 0) })
}

// WithOnRecordFailure sets what happens to a record whose guest call faults (a trap, a limit,
// a non-zero return) without having changed anything: f runs on the runner, and when it
// returns nil the record is dropped (f dead-letters it) and the run goes on; an error fails
// the run with it. A call that changed state, timers or outputs before faulting still fails
// the run (its effects cannot be taken back), as do timers. Default: every fault fails the run.
func WithOnRecordFailure(f func(RecordFailure) error) Option {
	return optionFunc(func(c *config) { c.OnRecordFailure = f })
}

// WithDescribe sets how errors name a record position, e.g. "input line 42" (default
// "record #N").
func WithDescribe(f func(pos int64) string) Option {
	return optionFunc(func(c *config) { c.Describe = f })
}
