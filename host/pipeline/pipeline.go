// Package pipeline runs a bounded local pipeline: an input file of records, one Wasm operator
// driven by the async execution controller, and a JSON Lines output. It is what
// `clink-wasm run` does, and the building block hosted pipelines reuse.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/lookup"
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
	// Restore is the checkpoint to restore: 0 starts empty, state.RestoreLatest the newest.
	Restore uint64
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
	if opts.Format != FormatJSONL && opts.Format != FormatCSV {
		return sum, fmt.Errorf("unknown input format %q (use jsonl or csv)", opts.Format)
	}
	if opts.OnMalformed == "" {
		opts.OnMalformed = MalformedFail
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
	var lookupFn scheduler.LookupFunc
	if len(opts.Endpoints) > 0 {
		reg := opts.Registry
		if reg == nil {
			reg = lookup.NewRegistry()
		}
		fn, closeLookups, err := openLookups(reg, opts.Tenant, opts.Endpoints, mod.Manifest.Endpoints)
		if err != nil {
			return sum, err
		}
		defer func() { sum.Lookups = closeLookups() }()
		lookupFn = fn
	}
	sum.Operator = mod.Name()
	backend, ckpt, nextID, closeState, err := openState(ctx, opts, mod.Name())
	if err != nil {
		return sum, err
	}
	defer closeState()
	if err := backend.Open(mod.Manifest.States); err != nil {
		return sum, fmt.Errorf("state: %w", err)
	}
	describe := func(pos int64) string { return fmt.Sprintf("input line %d", pos) }
	sink := newJSONLSink(opts.Output, mod.Name(), describe)
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

	ctrl, err := scheduler.New(scheduler.Config{
		Module: mod, Backend: backend, Sink: sink, Lookup: lookupFn, Order: opts.Order,
		Log: logTo(opts.Log, describe), MaxInFlight: opts.MaxInFlight, Describe: describe,
		OnBarrier: onBarrier,
	})
	if err != nil {
		sink.close()
		return sum, err
	}

	elems := make(chan []scheduler.Element, 8)
	stop := make(chan struct{})
	srcErr := make(chan error, 1)
	go func() { srcErr <- src.run(elems, stop) }()

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

	runErr := ctrl.Run(ctx, elems)
	close(stop)
	for range elems { // let the source finish if the controller stopped early
	}
	sErr := <-srcErr
	close(progressDone)
	sinkErr := sink.close()

	// The final checkpoint: what a bounded run leaves behind, and what --restore latest resumes.
	var ckptErr error
	if ckpt != nil {
		if runErr == nil && sErr == nil && sinkErr == nil && ctx.Err() == nil {
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
	sum.Scheduler = ctrl.Metrics().Snapshot()
	sum.MaxInFlight = ctrl.MaxInFlight()
	// The first failure in pipeline order: a bad output is found after the controller moved on,
	// so it explains a controller error that merely reports the sink refusing more.
	var oe *OutputError
	switch {
	case errors.As(sinkErr, &oe):
		return sum, sinkErr
	case runErr != nil:
		return sum, runErr
	case sErr != nil:
		return sum, sErr
	case sinkErr != nil:
		return sum, sinkErr
	case ckptErr != nil:
		return sum, ckptErr
	}
	return sum, nil
}

// openState returns the run's backend: a fixed one, process memory, or an operator of a durable
// pool with its checkpointer and first checkpoint id.
func openState(ctx context.Context, opts Options, name string) (state.Backend, *checkpointer, uint64, func(), error) {
	if opts.Backend != nil {
		return opts.Backend, nil, 0, func() {}, nil
	}
	if opts.StateURL == "" {
		return state.NewMemory(), nil, 0, func() {}, nil
	}
	st, err := state.Open(ctx, opts.StateURL)
	if err != nil {
		return nil, nil, 0, nil, fmt.Errorf("state: %w", err)
	}
	job := opts.Job
	if job == "" {
		job = name
	}
	next, err := nextCheckpointID(ctx, st, "", job)
	if err != nil {
		st.Close()
		return nil, nil, 0, nil, fmt.Errorf("state pool %s: %w", redactURL(opts.StateURL), err)
	}
	b, err := st.Operator(ctx, state.OperatorOptions{Name: job, RestoreFrom: opts.Restore})
	if err != nil {
		st.Close()
		if opts.Restore != 0 {
			return nil, nil, 0, nil, fmt.Errorf("restoring %s from %s: %w", job, redactURL(opts.StateURL), err)
		}
		return nil, nil, 0, nil, fmt.Errorf("state pool %s: %w", redactURL(opts.StateURL), err)
	}
	return b, newCheckpointer(b), next, func() { b.Close(); st.Close() }, nil
}

// redactURL drops credentials a state URL might carry before it goes into a message.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
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
