package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/connector/ingest"
	"github.com/clink-wasm/clink-wasm/host/control"
	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// # The runtime
//
// The server runs each started pipeline in process through pipeline.Start: modules come from
// the registry, state and checkpoint records live in the pool control.StateURL gives the
// pipeline (under its tenant and id), and the tenant's quotas become the operators' limits and
// the state tier's hot-tier budget. A run's ingest log and preview output live on the local
// disk under Config.RunDir/<tenant>/<id>/. A watcher records each committed checkpoint in the
// control plane and the run's end (stopped, failed, finished); the record's Running flag says
// whether a restarted server resumes it (from its last checkpoint).

const (
	maxCapturedErrors     = 100
	maxCheckpointHistory  = 100
	checkpointPollEvery   = 200 * time.Millisecond
	shutdownStopTimeout   = 30 * time.Second
	defaultMaxIngestBytes = 8 << 20
)

// run is one run of a pipeline; the last run of each pipeline is kept after it ends (for its
// metrics, errors and checkpoints).
type run struct {
	id, tenant string
	stateURL   string
	dir        string
	job        *pipeline.Job
	log        *ingest.Log
	store      *state.Store
	done       chan struct{} // closed once the watcher has recorded the end
	shutdown   bool          // set (under runtime.mu) when the server stops it: Running stays set
	ingests    bool          // the spec has an http source
	ingestSrc  string        // its name
	name       string        // the pipeline record's name
	rawSpec    json.RawMessage

	quotaErr error // set (under mu) when the server stops the run for a quota (quotas_live.go)

	mu     sync.Mutex
	errs   []CapturedError
	cps    []CheckpointView
	lastCP uint64
	final  *pipeline.JobMetrics

	histDirty bool      // errs or cps changed since the last saveHistory
	histSaved time.Time // when history was last saved
}

// CapturedError is an error a run logged or failed with.
type CapturedError struct {
	At       time.Time `json:"at"`
	Message  string    `json:"message"`
	Error    string    `json:"error"`
	Operator string    `json:"operator,omitempty"`
	Key      string    `json:"key,omitempty"`
	Record   string    `json:"record,omitempty"` // where: "input line 42", a timer
}

// CheckpointView is one committed checkpoint of a run.
type CheckpointView struct {
	ID         uint64                      `json:"id"`
	Savepoint  bool                        `json:"savepoint,omitempty"`
	Final      bool                        `json:"final,omitempty"`
	DurationMs float64                     `json:"duration_ms"`
	StateBytes int64                       `json:"state_bytes"`
	Positions  map[string][]pipeline.Split `json:"positions,omitempty"`
	At         time.Time                   `json:"at"`
}

func (r *run) capture(e CapturedError) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) >= maxCapturedErrors {
		r.errs = r.errs[1:]
	}
	r.errs = append(r.errs, e)
	r.histDirty = true
}

func captureOf(msg string, err error, at time.Time) CapturedError {
	ce := CapturedError{At: at, Message: msg, Error: err.Error()}
	var oe *scheduler.OperatorError
	if errors.As(err, &oe) {
		ce.Operator, ce.Key, ce.Record = oe.Operator, string(oe.Key), oe.Where
	}
	return ce
}

// running reports whether the run's job has not ended.
func (r *run) running() bool {
	select {
	case <-r.job.Done():
		return false
	default:
		return true
	}
}

// captureHandler passes records on and keeps those at warning level or above that carry an
// error as the run's captured errors.
type captureHandler struct {
	slog.Handler
	r *run
}

func (h captureHandler) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Level >= slog.LevelWarn {
		var (
			err error
			op  string
		)
		rec.Attrs(func(a slog.Attr) bool {
			if e, ok := a.Value.Any().(error); ok && err == nil {
				err = e
			} else if a.Key == "operator" && a.Value.Kind() == slog.KindString {
				op = a.Value.String() // e.g. the state pool's background failures name it
			}
			return true
		})
		if err != nil {
			ce := captureOf(rec.Message, err, rec.Time)
			if ce.Operator == "" {
				ce.Operator = op
			}
			h.r.capture(ce)
		}
	}
	return h.Handler.Handle(ctx, rec)
}

func (h captureHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return captureHandler{Handler: h.Handler.WithAttrs(as), r: h.r}
}

func (h captureHandler) WithGroup(n string) slog.Handler {
	return captureHandler{Handler: h.Handler.WithGroup(n), r: h.r}
}

// runtime is the server's set of runs.
type runtime struct {
	s        *Server
	lookups  *lookup.Registry
	mu       sync.Mutex
	runs     map[string]*run
	starting map[string]string // pipeline id → tenant, while it starts
	// admitMu serializes the guest CPU budget's check with the starts and quota changes it
	// depends on (cpubudget.go); taken before mu, and before the control plane's Update.
	admitMu   sync.Mutex
	cpuBudget int64 // millicores; 0: no check (cpubudget.go)
	closed    bool
	gates     map[string]*lookupGate   // per tenant
	shares    map[string]*abi.CPUShare // per tenant: guest_cpu_millicores × capacity
	// shareQuota is each tenant's guest_cpu_millicores, capacity the host's (capacity.go).
	shareQuota map[string]int64
	capacity   float64
	usage      map[string]*tenantUsage // per tenant
	ctx        context.Context         // runs outlive requests; cancelled by Close
	cancel     context.CancelFunc
	wg         sync.WaitGroup
}

func newRuntime(s *Server) *runtime {
	ctx, cancel := context.WithCancel(context.Background())
	rt := &runtime{s: s, lookups: lookup.NewRegistry(), runs: map[string]*run{}, starting: map[string]string{}, cpuBudget: defaultCPUBudget(s.cfg.GuestCPUBudget),
		gates: map[string]*lookupGate{}, shares: map[string]*abi.CPUShare{}, shareQuota: map[string]int64{}, capacity: 1,
		usage: map[string]*tenantUsage{}, ctx: ctx, cancel: cancel}
	if !s.cfg.FixedCPUShares {
		rt.wg.Add(1)
		go rt.capacityLoop(readSchedstat)
	}
	return rt
}

func (rt *runtime) get(id string) *run {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.runs[id]
}

// active returns the run of id if its job is running.
func (rt *runtime) active(id string) *run {
	if r := rt.get(id); r != nil && r.running() {
		return r
	}
	return nil
}

// ErrAlreadyRunning refuses a start of a running pipeline.
var ErrAlreadyRunning = errors.New("the pipeline is running already")

// applyQuotas turns the tenant's quotas into the spec's limits: each operator instance's
// memory and guest time per call, each operator subtask's share of the pipeline's in-flight
// records. Limits the spec sets lower are kept (checkSpec refused higher ones).
func applyQuotas(spec *pipeline.Spec, q control.Quotas) {
	opSubtasks := 0
	for i := range spec.Operators {
		opSubtasks += max(1, spec.Operators[i].Parallelism)
	}
	share := max(1, q.MaxInFlightRecords/max(1, opSubtasks))
	pages := uint32(min(int64(65536), q.GuestMemoryBytes/wasmPage))
	cpu := time.Duration(q.CPUTimePerRecordMs) * time.Millisecond
	for i := range spec.Operators {
		l := &spec.Operators[i].Limits
		if pages > 0 && (l.MemoryPages == 0 || l.MemoryPages > pages) {
			l.MemoryPages = min(pages, 4096)
			if l.MemoryPages == 0 {
				l.MemoryPages = pages
			}
		}
		if cpu > 0 && (l.CallTimeout == 0 || l.CallTimeout.D() > cpu) {
			l.CallTimeout = pipeline.Duration(cpu)
		}
		if l.MaxInFlight == 0 || l.MaxInFlight > share {
			l.MaxInFlight = share
		}
	}
}

// runDir is where pipeline id of tenant keeps its ingest log and preview output.
func (rt *runtime) runDir(tenant, id string) (string, error) {
	if !control.ValidTenantName(tenant) || !control.ValidPipelineID(id) {
		return "", fmt.Errorf("bad tenant or pipeline id %q/%q", tenant, id)
	}
	return filepath.Join(rt.s.cfg.RunDir, tenant, id), nil
}

func previewDir(dir string) string { return filepath.Join(dir, "preview") }

// openLog opens pipeline p's ingest log.
func (rt *runtime) openLog(dir string) (*ingest.Log, error) {
	return ingest.Open(filepath.Join(dir, "ingest.log"), ingest.Options{MaxLagBytes: rt.s.cfg.MaxIngestLagBytes})
}

// start runs pipeline p from its last committed checkpoint (a fresh start when it has none).
func (rt *runtime) start(ctx context.Context, p *control.Pipeline) (*run, error) {
	rt.admitMu.Lock()
	rt.mu.Lock()
	unlock := func() {
		rt.mu.Unlock()
		rt.admitMu.Unlock()
	}
	if rt.closed {
		unlock()
		return nil, errors.New("the server is shutting down")
	}
	if r := rt.runs[p.ID]; r != nil && r.running() {
		unlock()
		return nil, ErrAlreadyRunning
	}
	if _, ok := rt.starting[p.ID]; ok {
		unlock()
		return nil, ErrAlreadyRunning
	}
	// A pipeline whose record says it runs was admitted (a resume, an upgrade's restart).
	if !p.Running {
		if err := rt.admitCPULocked(rt.s.ctl.Snapshot(), p.Tenant); err != nil {
			unlock()
			return nil, err
		}
	}
	rt.starting[p.ID] = p.Tenant
	prev := rt.runs[p.ID]
	unlock()
	defer func() {
		rt.mu.Lock()
		delete(rt.starting, p.ID)
		rt.mu.Unlock()
	}()
	if prev != nil {
		<-prev.done // the previous run's end is recorded before a new one begins
	}
	nr := &run{id: p.ID, tenant: p.Tenant, done: make(chan struct{})}
	rt.seedHistory(ctx, nr, prev)
	r, err := rt.startRun(ctx, p, nr)
	if err != nil {
		return nil, err
	}
	rt.mu.Lock()
	rt.runs[p.ID] = r
	rt.mu.Unlock()
	return r, nil
}

func (rt *runtime) startRun(ctx context.Context, p *control.Pipeline, r *run) (*run, error) {
	s := rt.s
	cat := s.ctl.Snapshot()
	t, ok := cat.Tenants[p.Tenant]
	if !ok {
		return nil, notFound("tenant", p.Tenant)
	}
	spec, err := runtimeSpec(p.Name, p.Tenant, p.Spec)
	if err != nil {
		return nil, err
	}
	// The quota may have been lowered since the spec was accepted: a new start (of a pipeline
	// not running) must fit in it with the running pipelines' subtasks. A pipeline whose record
	// says it runs was admitted when it started (or when its spec changed, checkSpec): a resume
	// after a restart and the restart of an upgrade or rescale are not refused by a quota
	// lowered meanwhile (quotas_live.go, "Quotas lowered below usage").
	used := 0
	for _, o := range cat.TenantPipelines(p.Tenant) {
		if o.ID != p.ID && rt.active(o.ID) != nil {
			used += o.Subtasks
		}
	}
	if !p.Running && used+p.Subtasks > t.Quotas.MaxSubtasks {
		return nil, quotaProblem("quotas.max_subtasks", "starting %s needs %d subtasks; tenant %q runs %d of its %d", p.ID, p.Subtasks, p.Tenant, used, t.Quotas.MaxSubtasks)
	}
	if err := rt.checkStateQuota(ctx, p.Tenant, true); err != nil {
		return nil, quotaProblem("quotas.state_bytes", "%v", err)
	}
	r.name, r.rawSpec = p.Name, p.Spec
	applyQuotas(spec, t.Quotas)
	gate := rt.gate(p.Tenant, t.Quotas.LookupRequestsPerSec)
	gate.setRate(t.Quotas.LookupRequestsPerSec)
	for _, src := range spec.Sources {
		if src.Type == ingest.SourceType && !r.ingests {
			r.ingests, r.ingestSrc = true, src.Name
		}
	}
	if r.stateURL, err = control.StateURL(s.cfg.DataURL, p.Tenant, p.ID); err != nil {
		return nil, err
	}
	if r.dir, err = rt.runDir(p.Tenant, p.ID); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, err
	}
	if r.log, err = rt.openLog(r.dir); err != nil {
		return nil, err
	}
	logger := slog.New(captureHandler{Handler: s.log.Handler(), r: r}).With("tenant", p.Tenant, "pipeline", p.ID)
	// The pool's background failures (compaction, garbage collection) go to the server's log.
	opts := append(slices.Clone(s.cfg.StateOptions), state.WithRetainCheckpoints(spec.Checkpoints.Retain+4), state.WithLogger(logger))
	if t.Quotas.HotTierBytes > 0 {
		opts = append(opts, state.WithHotBytes(t.Quotas.HotTierBytes))
	}
	if r.store, err = state.Open(ctx, r.stateURL, opts...); err != nil {
		r.log.Close()
		return nil, fmt.Errorf("opening the state pool: %w", err)
	}
	env := pipeline.Env{
		Connectors: s.hostedConnectors(r.log, previewDir(r.dir)),
		StateURL:   r.stateURL,
		Store:      r.store,
		Restore:    "latest-if-any",
		Lookups:    rt.lookups,
		LookupGate: gate,
		CPUShare:   rt.share(p.Tenant, t.Quotas.GuestCPUMillicores),
		Log:        logger,
		Modules: func(ctx context.Context, ref string) ([]byte, error) {
			m, err := resolveModule(s.ctl.Snapshot(), p.Tenant, ref, "module")
			if err != nil {
				return nil, err
			}
			return s.ctl.Blob(ctx, m.ID)
		},
	}
	job, err := pipeline.Start(ctx, spec, env)
	if err != nil {
		r.store.Close()
		r.log.Close()
		var se *pipeline.SpecError
		if errors.As(err, &se) {
			return nil, specProblem(err)
		}
		return nil, fmt.Errorf("starting pipeline %s: %w", p.ID, err)
	}
	r.job = job
	running := true
	if err := s.ctl.SetPipelineState(ctx, p.ID, control.PipelineRunning, "", &running); err != nil {
		s.log.Warn("recording a pipeline's start failed", "pipeline", p.ID, "err", err)
	}
	rt.wg.Add(1)
	go rt.watch(r)
	return r, nil
}

// watch records r's checkpoints in the control plane as they commit, then its end.
func (rt *runtime) watch(r *run) {
	defer rt.wg.Done()
	defer close(r.done)
	s := rt.s
	t := time.NewTicker(checkpointPollEvery)
	defer t.Stop()
	for {
		select {
		case <-r.job.Done():
		case <-t.C:
			rt.noteCheckpoint(r, r.job.Metrics().LastCheckpoint)
			rt.saveHistory(r, false)
			continue
		}
		break
	}
	m, err := r.job.Wait()
	rt.noteCheckpoint(r, m.LastCheckpoint)
	r.mu.Lock()
	r.final = &m
	r.mu.Unlock()
	st, msg := control.PipelineFinished, ""
	switch m.State {
	case pipeline.JobStopped:
		st = control.PipelineStopped
	case pipeline.JobFailed:
		st = control.PipelineFailed
	}
	if err != nil {
		st, msg = control.PipelineFailed, err.Error()
		r.capture(captureOf("the pipeline failed", err, time.Now()))
	}
	r.mu.Lock()
	qerr := r.quotaErr
	r.mu.Unlock()
	if qerr != nil {
		st, msg = control.PipelineFailed, qerr.Error()
		r.capture(captureOf("the pipeline was stopped: over a quota", qerr, time.Now()))
	}
	rt.mu.Lock()
	shutdown := r.shutdown
	rt.mu.Unlock()
	var running *bool
	if !shutdown || st == control.PipelineFailed || st == control.PipelineFinished {
		f := false
		running = &f
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if shutdown && st == control.PipelineStopped {
		st = control.PipelineRunning // it resumes with the server
	}
	if err := s.ctl.SetPipelineState(ctx, r.id, st, msg, running); err != nil && !errors.Is(err, control.ErrNotFound) {
		s.log.Warn("recording a pipeline's end failed", "pipeline", r.id, "err", err)
	}
	rt.saveHistory(r, true)
	r.store.Close()
	r.log.Close()
	s.log.Info("pipeline ended", "tenant", r.tenant, "pipeline", r.id, "state", m.State, "err", err)
}

// noteCheckpoint records a newly committed checkpoint.
func (rt *runtime) noteCheckpoint(r *run, ci *pipeline.CheckpointInfo) {
	if ci == nil {
		return
	}
	r.mu.Lock()
	if ci.ID <= r.lastCP {
		r.mu.Unlock()
		return
	}
	r.lastCP = ci.ID
	now := rt.s.ctl.Now()
	if len(r.cps) >= maxCheckpointHistory {
		r.cps = r.cps[1:]
	}
	r.cps = append(r.cps, CheckpointView{ID: ci.ID, Savepoint: ci.Savepoint, Final: ci.Final, DurationMs: float64(ci.Duration.Microseconds()) / 1000,
		StateBytes: ci.StateBytes, Positions: ci.Positions, At: now})
	r.histDirty = true
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rt.s.ctl.SetCheckpoint(ctx, r.id, control.CheckpointPointer{ID: ci.ID, URL: r.stateURL, Savepoint: ci.Savepoint, At: now}); err != nil && !errors.Is(err, control.ErrNotFound) {
		rt.s.log.Warn("recording a checkpoint failed", "pipeline", r.id, "checkpoint", ci.ID, "err", err)
	}
	if r.job != nil && r.running() {
		if err := rt.checkStateQuota(ctx, r.tenant, false); err != nil {
			go rt.failForQuota(r, err)
		}
	}
	// The ingest log before the committed position is never read again (a restore takes the
	// newest committed checkpoint): free it.
	if ps := ci.Positions[r.ingestSrc]; r.ingests && len(ps) == 1 && len(ps[0].Position) > 0 {
		var pos struct {
			Offset int64 `json:"offset"`
		}
		if json.Unmarshal(ps[0].Position, &pos) == nil {
			if err := r.log.Release(pos.Offset); err != nil && !errors.Is(err, ingest.ErrClosed) {
				rt.s.log.Warn("releasing the ingest log behind a checkpoint failed", "pipeline", r.id, "err", err)
			}
		}
	}
}

// stop ends r's job (with a final savepoint when asked) and waits until its end is recorded.
func (rt *runtime) stop(ctx context.Context, r *run, savepoint bool) (uint64, error) {
	id, err := r.job.Stop(ctx, savepoint)
	if err != nil {
		return id, err
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		return id, ctx.Err()
	}
	if id != 0 {
		rt.noteCheckpoint(r, &pipeline.CheckpointInfo{ID: id, Savepoint: true})
	}
	return id, nil
}

// restart stops r with a savepoint, keeping the pipeline's Running flag, and starts pipeline id
// again from its record (the new spec) and that savepoint: an upgrade.
func (rt *runtime) restart(ctx context.Context, r *run, id string) error {
	rt.mu.Lock()
	r.shutdown = true
	rt.mu.Unlock()
	if _, err := rt.stop(ctx, r, true); err != nil {
		return problem(http.StatusInternalServerError, CodeInternal, "", "stopping for the upgrade: %v", err)
	}
	p, ok := rt.s.ctl.Snapshot().Pipelines[id]
	if !ok {
		return notFound("pipeline", id)
	}
	if _, err := rt.start(ctx, p); err != nil {
		f := false
		_ = rt.s.ctl.SetPipelineState(ctx, id, control.PipelineFailed, "restarting after the upgrade: "+err.Error(), &f)
		var pr *Problem
		if errors.As(err, &pr) {
			return err
		}
		return problem(http.StatusUnprocessableEntity, CodeIncompatibleState, "spec", "the new spec could not start from the savepoint: %v", err)
	}
	return nil
}

// forget drops a deleted pipeline's last run and its local files (ingest log, preview output).
// Its state pool stays under the data URL.
func (rt *runtime) forget(tenant, id string) {
	rt.mu.Lock()
	delete(rt.runs, id)
	rt.mu.Unlock()
	if control.ValidTenantName(tenant) && control.ValidPipelineID(id) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := rt.s.ctl.Store().Delete(ctx, historyName(tenant, id)); err != nil {
			rt.s.log.Warn("removing a deleted pipeline's run history failed", "pipeline", id, "err", err)
		}
		cancel()
	}
	if dir, err := rt.runDir(tenant, id); err == nil {
		if err := os.RemoveAll(dir); err != nil {
			rt.s.log.Warn("removing a deleted pipeline's files failed", "pipeline", id, "err", err)
		}
	}
}

// resume starts every pipeline whose record says it should run (after a restart).
func (rt *runtime) resume(ctx context.Context) {
	for _, p := range rt.s.ctl.Snapshot().Pipelines {
		if !p.Running {
			continue
		}
		if _, err := rt.start(ctx, p); err != nil {
			rt.s.log.Error("resuming a pipeline failed", "tenant", p.Tenant, "pipeline", p.ID, "err", err)
			f := false
			_ = rt.s.ctl.SetPipelineState(ctx, p.ID, control.PipelineFailed, "resuming after a restart: "+err.Error(), &f)
			continue
		}
		rt.s.log.Info("pipeline resumed", "tenant", p.Tenant, "pipeline", p.ID)
	}
	rt.warnOvercommitted()
}

// close stops every run with a savepoint (bounded), keeping their Running flags so that the
// next server resumes them.
func (rt *runtime) close() {
	rt.mu.Lock()
	rt.closed = true
	var runs []*run
	for _, r := range rt.runs {
		if r != nil && r.job != nil && r.running() {
			r.shutdown = true
			runs = append(runs, r)
		}
	}
	rt.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), shutdownStopTimeout)
			defer cancel()
			if _, err := rt.stop(ctx, r, true); err != nil {
				rt.s.log.Warn("stopping a pipeline with a savepoint failed; cancelling it", "pipeline", r.id, "err", err)
				_, _ = r.job.Stop(context.Background(), false)
			}
		}()
	}
	wg.Wait()
	rt.cancel()
	rt.wg.Wait()
}
