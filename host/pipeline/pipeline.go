// Package pipeline runs a bounded local pipeline: an input file of records, one Wasm operator
// driven by the async execution controller, and a JSON Lines output. It is what
// `clink-wasm run` does, and the building block hosted pipelines reuse.
package pipeline

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/replay"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// Options configures a run. Zero values mean defaults.
type Options struct {
	// Module is the operator's .wasm bytes.
	Module []byte

	Input     io.Reader
	InputSize int64 // for progress; 0 if unknown
	Format    Format

	// KeyField keys records by a top-level field of the JSON value (or CSV column). When empty
	// and the module exports clink_key, the guest keys records; otherwise every record has the
	// empty key.
	KeyField string
	// TimeField takes event time from a field (epoch ms or RFC 3339); otherwise records carry
	// ingestion time and the only watermark is the final one.
	TimeField      string
	WatermarkDelay time.Duration // bounded out-of-orderness
	WatermarkEvery int           // records between watermarks (default 1000)

	OnMalformed MalformedPolicy
	DeadLetter  io.Writer

	Output io.Writer
	Log    io.Writer // guest logs; nil discards

	Limits      abi.Limits
	MaxInFlight int
	CacheDir    string // wazero compilation cache; "" keeps it in memory

	// StateURL names the durable state pool (file://, s3://, mem://). Empty with a nil Backend
	// keeps state in process memory, without checkpoints.
	StateURL string
	// Job is the operator's stable identity in the state pool (default: the module's name).
	Job string
	// Restore is the checkpoint to restore: 0 starts empty, state.RestoreLatest the newest (an
	// error wrapping ErrNoCheckpoint if there is none), RestoreLatestIfAny the newest if there
	// is one. A checkpoint records the module that wrote it: another module may restore it only
	// if they share a state name (an upgrade, reported in Summary.Restored); otherwise the run
	// fails with ErrModuleMismatch.
	Restore uint64
	// HotBytes bounds the durable pool's hot tier (state.WithHotBytes; it overrides the URL's
	// hot_bytes). 0 keeps the pool's default.
	HotBytes int64
	// CheckpointEvery takes a checkpoint after this much time (default 10s; <0 only the final
	// one). With a durable pool, a final checkpoint is always taken at the end of the input.
	CheckpointEvery time.Duration
	// Backend, if set, holds keyed state instead of a pool (tests); no checkpoints are taken.
	Backend state.Backend
	// Endpoints are the pipeline's named HTTP endpoints, opened through Registry (a private
	// one if nil) for Tenant.
	Endpoints []lookup.EndpointConfig
	Registry  *lookup.Registry
	Tenant    string
	// Order is the output order guarantee (default per key). Input and none are for unkeyed
	// enrichment: records run concurrently and keyed state is not available.
	Order scheduler.Order

	// Record, if set, records what the run sees (host/replay, docs/recording.md). The caller
	// creates it and closes it with the run's error; a recording that fails (its size cap)
	// fails the run.
	Record *replay.Recorder

	// Progress, if set, is called about five times a second while the run lasts.
	Progress func(Progress)
}

// Progress is a snapshot of a running pipeline.
type Progress struct {
	BytesRead, InputSize int64
	RecordsIn, Outputs   int64
	Elapsed              time.Duration
}

// Summary reports a finished run.
type Summary struct {
	Operator    string
	RecordsIn   int64
	RecordsOut  int64
	Skipped     int64
	Duration    time.Duration
	Scheduler   scheduler.Snapshot
	MaxInFlight int

	// Checkpoints are the checkpoints made durable during the run, the last one final.
	Checkpoints     []uint64
	CheckpointBytes int64
	State           *state.Metrics // durable pools only
	// Resumable says whether the checkpoints outlive the process (not a mem:// pool).
	Resumable bool
	// Restored says what was restored; nil without Options.Restore.
	Restored *RestoreInfo
	// Lookups are the metrics of each endpoint.
	Lookups map[string]lookup.Metrics
}

// RecordsPerSecond is the input throughput of the run.
func (s *Summary) RecordsPerSecond() float64 {
	if s.Duration <= 0 {
		return 0
	}
	return float64(s.RecordsIn) / s.Duration.Seconds()
}

// Run executes the pipeline to the end of its input. On failure the returned Summary still
// describes what was done.
func Run(ctx context.Context, opts Options) (*Summary, error) {
	start := time.Now()
	sum := &Summary{}
	if opts.Output == nil || opts.Input == nil {
		return sum, errors.New("pipeline: Input and Output are required")
	}
	if opts.Format == "" {
		opts.Format = FormatJSONL
	}
	if opts.OnMalformed == "" {
		opts.OnMalformed = MalformedFail
	}
	if err := opts.validate(); err != nil {
		return sum, err
	}
	engOpts := []abi.EngineOption{abi.WithLimits(opts.Limits)}
	if opts.CacheDir != "" {
		engOpts = append(engOpts, abi.WithCompilationCacheDir(opts.CacheDir))
	}
	eng, err := abi.NewEngine(ctx, engOpts...)
	if err != nil {
		return sum, err
	}
	defer eng.Close(context.WithoutCancel(ctx))
	mod, err := eng.Load(ctx, opts.Module, abi.LoadOptions{Endpoints: append([]string{}, EndpointNames(opts.Endpoints)...)})
	if err != nil {
		return sum, err
	}
	if opts.Order != scheduler.OrderPerKey && len(mod.Manifest.States) > 0 {
		return sum, fmt.Errorf("%w: operator %q declares keyed state (%s), which needs per-key order: output order %s runs the records of a key concurrently; use order key",
			ErrOrderWithState, mod.Name(), strings.Join(mod.Manifest.States, ", "), orderFlagName(opts.Order))
	}
	var lookupFn scheduler.LookupFunc
	if len(opts.Endpoints) > 0 {
		reg := opts.Registry
		if reg == nil {
			reg = lookup.NewRegistry(lookup.WithLogger(lookupLogger(opts.Log)))
		}
		fn, closeLookups, err := openLookups(reg, opts.Tenant, opts.Endpoints, mod.Manifest.Endpoints)
		if err != nil {
			return sum, err
		}
		defer func() { sum.Lookups = closeLookups() }()
		lookupFn = fn
	}
	sum.Operator = mod.Name()
	ds, err := openState(ctx, opts, mod.Name(), IdentifyModule(opts.Module, mod.Name(), mod.Manifest.States))
	if err != nil {
		return sum, err
	}
	defer ds.close()
	backend, ckpt, nextID := ds.backend, ds.ckpt, ds.next
	sum.Restored = ds.restored
	sum.Resumable = ckpt != nil && !strings.HasPrefix(opts.StateURL, "mem:")
	sched := backend // what the scheduler sees: the backend, or its recording wrapper
	if rec := opts.Record; rec != nil {
		origin := "unknown"
		if opts.Backend == nil {
			origin = replay.StateOriginEmpty
			if ds.restored != nil && ds.restored.Checkpoint != 0 {
				origin = fmt.Sprintf("checkpoint %d", ds.restored.Checkpoint)
			}
		}
		if err := rec.Begin(replay.RunInfo{
			Operator: mod.Name(), ModuleSHA256: IdentifyModule(opts.Module, mod.Name(), nil).SHA256,
			States: mod.Manifest.States, Order: opts.Order, KeyField: opts.KeyField, TimeField: opts.TimeField,
			StateOrigin: origin, Limits: eng.Limits(), Declared: mod.Manifest.Endpoints, Endpoints: opts.Endpoints,
		}); err != nil {
			return sum, err
		}
		sched = rec.Backend(backend)
		lookupFn = rec.Lookup(lookupFn, mod.Manifest.Endpoints)
	}
	if err := sched.Open(mod.Manifest.States); err != nil {
		return sum, fmt.Errorf("state: %w", err)
	}
	describe := func(pos int64) string { return fmt.Sprintf("input line %d", pos) }
	sink := newJSONLSink(opts.Output, mod.Name(), describe)
	var schedSink scheduler.Sink = sink
	if opts.Record != nil {
		schedSink = opts.Record.Sink(sink)
	}
	lim := eng.Limits()
	src := newSource(sourceConfig{
		format: opts.Format, keyField: opts.KeyField, keyByModule: opts.KeyField == "" && mod.HasKey(),
		timeField: opts.TimeField, watermarkDelay: opts.WatermarkDelay, watermarkEvery: opts.WatermarkEvery,
		policy: opts.OnMalformed, deadLetter: opts.DeadLetter,
		maxKey: lim.MaxRecordKey, maxValue: lim.MaxRecordValue,
	}, opts.Input)
	var onBarrier func(uint64) error
	if ckpt != nil {
		src.checkpointEvery, src.nextCheckpoint = opts.CheckpointEvery, nextID
		if src.checkpointEvery == 0 {
			src.checkpointEvery = 10 * time.Second
		}
		onBarrier = ckpt.capture
	}
	if opts.Record != nil {
		src.tap = opts.Record.Elements
	}

	ctrl, err := scheduler.New(mod, sched, schedSink,
		scheduler.WithLookup(lookupFn), scheduler.WithOrder(opts.Order),
		scheduler.WithGuestLog(logTo(opts.Log, describe)), scheduler.WithMaxInFlight(opts.MaxInFlight),
		scheduler.WithDescribe(describe), scheduler.WithOnBarrier(onBarrier))
	if err != nil {
		sink.close()
		return sum, err
	}

	elems := make(chan []scheduler.Element, 8)
	stop := make(chan struct{})
	srcErr := make(chan error, 1)
	go func() {
		// A bug in reading the input (or a panicking Input reader) fails this run with an error;
		// it must not take down the process and every other pipeline in it.
		defer func() {
			if r := recover(); r != nil {
				srcErr <- fmt.Errorf("pipeline: internal error reading input (please report it): %v", r)
			}
		}()
		srcErr <- src.run(elems, stop)
	}()

	progressDone := make(chan struct{})
	if opts.Progress != nil {
		go func() {
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-progressDone:
					return
				case <-t.C:
					opts.Progress(Progress{BytesRead: src.r.n.Load(), InputSize: opts.InputSize,
						RecordsIn: src.recs.Load(), Outputs: sink.records.Load(), Elapsed: time.Since(start)})
				}
			}
		}()
	}

	// The controller's context ends with the run: when it fails, lookups and fetches still out
	// are cancelled instead of running on until the endpoints close.
	runCtx, cancelRun := context.WithCancel(ctx)
	runErr := ctrl.Run(runCtx, elems)
	cancelRun()
	close(stop)
	for range elems { // let the source finish if the controller stopped early
	}
	sErr := <-srcErr
	close(progressDone)
	sinkErr := sink.close()

	// The final checkpoint: what a bounded run leaves behind, and what --restore latest resumes.
	var ckptErr error
	if ckpt != nil {
		if runErr == nil && sErr == nil && sinkErr == nil && ctx.Err() == nil && (opts.Record == nil || opts.Record.Err() == nil) {
			ctrl.SaveTimers()
			ckptErr = ckpt.capture(src.nextCheckpoint)
		}
		if err := ckpt.finish(); ckptErr == nil {
			ckptErr = err
		}
		ckpt.mu.Lock()
		sum.Checkpoints = slices.Clone(ckpt.completed)
		sum.CheckpointBytes = ckpt.bytes
		ckpt.mu.Unlock()
		if t, ok := backend.(*state.Tiered); ok {
			m := t.Metrics()
			sum.State = &m
		}
	}
	sum.RecordsIn = src.recs.Load()
	sum.Skipped = src.skipped.Load()
	sum.RecordsOut = sink.records.Load()
	sum.Duration = time.Since(start)
	sum.Scheduler = ctrl.Metrics()
	sum.MaxInFlight = ctrl.MaxInFlight()
	// The first failure in pipeline order: a bad output or a failed write is found after the
	// controller moved on, so it explains a controller error that merely reports the sink
	// refusing more.
	switch {
	case sinkErr != nil:
		return sum, sinkErr
	case runErr != nil:
		return sum, runErr
	case sErr != nil:
		return sum, sErr
	case ckptErr != nil:
		return sum, ckptErr
	case opts.Record != nil && opts.Record.Err() != nil:
		return sum, opts.Record.Err()
	}
	return sum, nil
}

// ErrOrderWithState refuses a module that declares keyed state under an order other than per
// key: keyed state is not available there (nothing orders two records of a key).
var ErrOrderWithState = errors.New("keyed state needs per-key order")

func orderFlagName(o scheduler.Order) string {
	switch o {
	case scheduler.OrderPerKey:
		return "key"
	case scheduler.OrderInput:
		return "input"
	case scheduler.OrderNone:
		return "none"
	}
	return fmt.Sprintf("Order(%d)", o)
}

// validate refuses option values that have no meaning (zero values are defaults).
func (o *Options) validate() error {
	switch {
	case o.Format != FormatJSONL && o.Format != FormatCSV:
		return fmt.Errorf("unknown input format %q (use jsonl or csv)", o.Format)
	case o.OnMalformed != MalformedFail && o.OnMalformed != MalformedSkip:
		return fmt.Errorf("unknown malformed-record policy %q (use fail or skip)", o.OnMalformed)
	case o.MaxInFlight < 0:
		return fmt.Errorf("max in flight must be > 0 (or 0 for the default), not %d", o.MaxInFlight)
	case o.Limits.CallTime < 0:
		return fmt.Errorf("call time limit must be > 0 (or 0 for the default), not %v", o.Limits.CallTime)
	case o.Limits.MemoryPages > MaxMemoryPages:
		return fmt.Errorf("memory limit of %d pages exceeds the wasm32 maximum of %d (4 GiB)", o.Limits.MemoryPages, MaxMemoryPages)
	case o.HotBytes < 0:
		return fmt.Errorf("hot bytes must be > 0 (or 0 for the pool's default), not %d", o.HotBytes)
	case o.WatermarkDelay < 0:
		return fmt.Errorf("watermark delay must be >= 0, not %v", o.WatermarkDelay)
	case o.WatermarkEvery < 0:
		return fmt.Errorf("records between watermarks must be > 0 (or 0 for the default), not %d", o.WatermarkEvery)
	case o.Order > scheduler.OrderNone:
		return fmt.Errorf("unknown output order %d", o.Order)
	case o.Backend != nil && o.Restore != 0:
		return errors.New("restore needs a state pool (StateURL): a fixed Backend is used as it is")
	}
	l := o.Limits
	for _, f := range []struct {
		name string
		v    int
	}{{"record key", l.MaxRecordKey}, {"record value", l.MaxRecordValue}, {"state key", l.MaxStateKey}, {"state value", l.MaxStateValue},
		{"emitted value", l.MaxEmitValue}, {"emits per call", l.MaxEmitsPerCall}, {"lookup request", l.MaxLookupRequest},
		{"log message", l.MaxLogMessage}, {"prefetch value", l.MaxPrefetchValue}} {
		if f.v < 0 {
			return fmt.Errorf("%s limit must be > 0 (or 0 for the default), not %d", f.name, f.v)
		}
	}
	return nil
}

// MaxMemoryPages is the wasm32 maximum of linear memory, in 64 KiB pages (4 GiB).
const MaxMemoryPages = 65536

// durable is a run's keyed state: a fixed backend, process memory, or an operator of a durable
// pool with its checkpointer.
type durable struct {
	backend  state.Backend
	ckpt     *checkpointer // nil without a pool
	next     uint64        // the first checkpoint id of this run
	restored *RestoreInfo  // nil without --restore
	close    func()
}

// openState opens the run's state and, when asked, restores it. A restore that finds nothing to
// restore fails (unless latest-if-any), naming the job, the pool and the checkpoint looked for,
// and a checkpoint of a module that shares no state with this one is refused.
func openState(ctx context.Context, opts Options, name string, self ModuleIdentity) (*durable, error) {
	if opts.Backend != nil {
		return &durable{backend: opts.Backend, close: func() {}}, nil
	}
	if opts.StateURL == "" {
		if opts.Restore != 0 && opts.Restore != RestoreLatestIfAny {
			return nil, &NoCheckpointError{Job: cmp.Or(opts.Job, name), Pool: "process memory (no state pool)", Want: opts.Restore}
		}
		return &durable{backend: state.NewMemory(), close: func() {}}, nil
	}
	pool := redactURL(opts.StateURL)
	var stOpts []state.Option
	if opts.HotBytes > 0 {
		stOpts = append(stOpts, state.WithHotBytes(opts.HotBytes))
	}
	st, err := state.Open(ctx, opts.StateURL, stOpts...)
	if err != nil {
		return nil, fmt.Errorf("state pool %s: %w", pool, redactErr(err, opts.StateURL))
	}
	job := cmp.Or(opts.Job, name)
	complete, next, err := checkpointsOf(ctx, st, "", job)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("state pool %s: %w", pool, redactErr(err, opts.StateURL))
	}
	var info *RestoreInfo
	from := opts.Restore
	switch {
	case from == 0:
	case (from == state.RestoreLatest || from == RestoreLatestIfAny) && len(complete) > 0:
		from = complete[0] // the newest, named, so that what is restored is what is reported
	case from == RestoreLatestIfAny:
		from, info = 0, &RestoreInfo{}
	case from == state.RestoreLatest || !slices.Contains(complete, from):
		st.Close()
		return nil, &NoCheckpointError{Job: job, Pool: pool, Want: from, Existing: complete}
	}
	b, err := st.Operator(ctx, state.OperatorOptions{Name: job, RestoreFrom: from})
	if err != nil {
		st.Close()
		if from != 0 {
			return nil, fmt.Errorf("restoring %s from %s: %w", job, pool, redactErr(err, opts.StateURL))
		}
		return nil, fmt.Errorf("state pool %s: %w", pool, redactErr(err, opts.StateURL))
	}
	if from != 0 {
		info = &RestoreInfo{Checkpoint: from, Into: self}
		if err := checkModule(info, b.OperatorState(ModuleStateName), self, job, pool); err != nil {
			b.Close()
			st.Close()
			return nil, err
		}
	}
	// Every checkpoint of this run records the module that wrote it.
	rec, _ := json.Marshal(self)
	b.SetOperatorState(ModuleStateName, rec)
	return &durable{backend: b, ckpt: newCheckpointer(b), next: next, restored: info, close: func() { b.Close(); st.Close() }}, nil
}

// redactURL drops the credentials a state URL might carry before it goes into a message: the
// password of its own userinfo, and that of any URL in its query (an S3 endpoint such as
// endpoint=http://user:pass@host).
func redactURL(s string) string { return secretReplacer(s).Replace(s) }

// RedactURL returns a state URL fit for a message: without the credentials it may carry.
func RedactURL(s string) string { return redactURL(s) }

// redactErr returns err with the credentials of rawURL taken out of its text. Errors from the
// state tier and the S3 client can quote the URL or the endpoint; errors.Is and errors.As
// still see through it.
func redactErr(err error, rawURL string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := secretReplacer(rawURL).Replace(msg); red != msg {
		return &redactedError{msg: red, err: err}
	}
	return err
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// secretReplacer replaces, in any text, the credentials that rawURL carries with "xxxxx".
func secretReplacer(rawURL string) *strings.Replacer {
	u, err := url.Parse(rawURL)
	if err != nil {
		return strings.NewReplacer(rawURL, "(unparsable URL)")
	}
	var pairs []string
	userinfo := func(ui *url.Userinfo) {
		pass, ok := ui.Password()
		if !ok {
			return
		}
		name := ui.Username()
		red := url.UserPassword(name, "xxxxx").String() + "@"
		for _, old := range []string{ui.String() + "@", name + ":" + pass + "@"} {
			pairs = append(pairs, old, red, url.QueryEscape(old), url.QueryEscape(red))
		}
		if len(pass) >= 6 { // long enough not to be found by accident in the message's own words
			pairs = append(pairs, pass, "xxxxx", url.QueryEscape(pass), "xxxxx")
		}
	}
	if u.User != nil {
		userinfo(u.User)
	}
	for _, vs := range u.Query() {
		for _, v := range vs {
			if vu, err := url.Parse(v); err == nil && vu.User != nil {
				userinfo(vu.User)
			}
		}
	}
	return strings.NewReplacer(pairs...)
}

func logTo(w io.Writer, describe func(int64) string) scheduler.LogFunc {
	if w == nil {
		return nil
	}
	return func(op string, level abi.LogLevel, msg []byte, src *scheduler.Source) {
		where := ""
		if src != nil {
			if src.Timer {
				where = fmt.Sprintf(" (timer at %d)", src.TS)
			} else {
				where = " (" + describe(src.Pos) + ")"
			}
		}
		fmt.Fprintf(w, "[%s] %s: %s%s\n", op, level, msg, where)
	}
}

// lookupLogger logs the endpoints' refusals (naming the rule) and breaker changes to the run's
// log writer, beside the guest's own log lines.
func lookupLogger(w io.Writer) *slog.Logger {
	if w == nil {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
