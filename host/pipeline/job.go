package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// Env is what a job runs in: the parts the CLI, the server and workers supply.
type Env struct {
	// Connectors builds the spec's sources and sinks (required).
	Connectors *Connectors
	// BaseDir resolves relative paths in the spec (modules, files). Default: the working
	// directory.
	BaseDir string
	// StateURL is the state pool when the spec names none.
	StateURL string
	// Store, if set, is used instead of opening StateURL (the server shares one Store).
	Store *state.Store
	// Modules resolves a module reference to its bytes. Default: read a file under BaseDir.
	Modules func(ctx context.Context, ref string) ([]byte, error)
	// Restore: "" or "none" starts fresh, "latest" restores the newest committed checkpoint
	// (an error if there is none), "latest-if-any" (alias "if-any") the newest if there is one, or a checkpoint id.
	Restore string
	// Lookups is the registry of endpoint clients (breakers are shared per tenant and endpoint).
	Lookups *lookup.Registry
	// CacheDir is wazero's compilation cache directory ("" keeps it in memory).
	CacheDir string
	// Log receives the runtime's structured logs (default: discarded).
	Log *slog.Logger
	// GuestLog receives guest log lines (nil discards them).
	GuestLog io.Writer
	// StuckAfter is how long a channel send may block before it is logged (default 5s).
	StuckAfter time.Duration
	// CPUShare, if set, bounds the guest execution time of every operator of the job (the
	// hosted platform's per-tenant CPU quota; shared by a tenant's jobs).
	CPUShare *abi.CPUShare
	// LookupGate, if set, admits every lookup before it is sent (the hosted platform's
	// per-tenant lookup rate; see live.go).
	LookupGate LookupGate
	// OnCommitPhase, if set, is called at each step of a checkpoint commit (fault injection):
	// an error fails the checkpoint, and so the attempt, at that point.
	OnCommitPhase func(phase CommitPhase, checkpoint uint64) error
	// Native, if set, runs the named operators as Go code instead of their modules (for the
	// benchmarks that measure what the Wasm operator costs; see NativeOperator). The function
	// is called once per subtask.
	Native map[string]func() NativeOperator

	flag *flagForm // the flag form's hooks (Run); nil for specs
}

func (e *Env) module(ctx context.Context, ref string) ([]byte, error) {
	if e.Modules != nil {
		return e.Modules(ctx, ref)
	}
	if strings.HasPrefix(ref, "sha256:") || (strings.Contains(ref, "@") && !strings.ContainsAny(ref, "/\\")) {
		return nil, fmt.Errorf("module %q is a registry reference; this environment has no module registry (give a .wasm path)", ref)
	}
	return os.ReadFile(e.Path(ref))
}

// Path resolves a path from the spec against BaseDir.
func (e *Env) Path(p string) string {
	if filepath.IsAbs(p) || e.BaseDir == "" {
		return p
	}
	return filepath.Join(e.BaseDir, p)
}

// JobState is where a job is in its life.
type JobState string

const (
	JobStarting   JobState = "starting"
	JobRunning    JobState = "running"
	JobRestarting JobState = "restarting"
	JobFinished   JobState = "finished"
	JobFailed     JobState = "failed"
	JobStopped    JobState = "stopped"
)

// Job is a running pipeline. Its methods are safe for concurrent use.
type Job struct {
	spec    *Spec
	env     Env
	store   *state.Store
	ownsSt  bool
	records recordStore
	sources map[string]Source
	sinks   map[string]Sink
	ops     []*opNode
	specSHA string

	requests chan request
	stopping atomic.Bool
	runCtx   context.Context
	cancel   context.CancelCauseFunc
	done     chan struct{}
	started  time.Time

	mu        sync.Mutex
	state     JobState
	err       error
	cur       *attempt
	attempts  int
	restarts  int
	last      *CheckpointInfo
	restored  uint64
	finalInfo JobMetrics
}

// Start validates spec, builds its connectors and modules, restores from the checkpoint env
// asks for, and starts the job. It returns once the job is running; Wait waits for its end.
func Start(ctx context.Context, spec *Spec, env Env) (*Job, error) {
	if env.Connectors == nil {
		return nil, errors.New("pipeline: Env.Connectors is required")
	}
	if env.Log == nil {
		env.Log = slog.New(slog.DiscardHandler)
	}
	spec.ApplyDefaults()
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	sources, sinks, err := env.Connectors.build(spec, &env)
	if err != nil {
		return nil, err
	}
	if spec.Mode == ModeBounded {
		for i := range spec.Sources {
			if !sources[spec.Sources[i].Name].Bounded() {
				return nil, &SpecError{Problems: []*FieldError{{Path: fmt.Sprintf("sources[%d]", i), Reason: "mode is bounded but this source never ends"}}}
			}
		}
	}
	specJSON, _ := MarshalSpec(spec)
	h := sha256.Sum256(specJSON)
	j := &Job{spec: spec, env: env, sources: sources, sinks: sinks, requests: make(chan request),
		done: make(chan struct{}), state: JobStarting, specSHA: hex.EncodeToString(h[:]), started: time.Now()}
	stateURL := spec.State.URL
	if stateURL == "" {
		stateURL = env.StateURL
	}
	if stateURL == "" {
		return nil, &SpecError{Problems: []*FieldError{{Path: "state.url", Reason: "required: no default state pool in this environment"}}}
	}
	if env.Store != nil {
		j.store = env.Store
	} else {
		// The state tier keeps the newest `retain` complete checkpoints. Keep a few more than
		// the job's records, so that a record's state survives the uncommitted checkpoints
		// that crashed attempts may leave behind it (one per attempt at most).
		// The pool's background failures (compaction, garbage collection) go to the job's log.
		st, err := state.Open(ctx, stateURL, state.WithRetainCheckpoints(spec.Checkpoints.Retain+4), state.WithLogger(jobLogger(env.Log, spec)))
		if err != nil {
			return nil, fmt.Errorf("state pool %s: %w", redactURL(stateURL), err)
		}
		j.store, j.ownsSt = st, true
	}
	fail := func(err error) (*Job, error) {
		j.closeResources(ctx)
		return nil, err
	}
	if j.records, err = openJobRecords(j.store, stateURL, spec.Tenant, spec.Name); err != nil {
		return fail(err)
	}
	if j.ops, err = loadOperators(ctx, spec, &env); err != nil {
		return fail(err)
	}
	restore, err := j.resolveRestore(ctx, env.Restore)
	if err != nil {
		return fail(err)
	}
	j.runCtx, j.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	go j.loop(restore)
	return j, nil
}

// resolveRestore reads the checkpoint record to restore, or nil for a fresh start.
func (j *Job) resolveRestore(ctx context.Context, restore string) (*CheckpointRecord, error) {
	switch strings.ToLower(restore) {
	case "", "none":
		return nil, nil
	case "latest", "latest-if-any", "if-any":
		rec, err := j.latest(ctx)
		if errors.Is(err, ErrNoCheckpoint) && (strings.EqualFold(restore, "if-any") || strings.EqualFold(restore, "latest-if-any")) {
			return nil, nil
		}
		return rec, err
	}
	id, err := strconv.ParseUint(restore, 10, 64)
	if err != nil || id == 0 {
		return nil, fmt.Errorf("restore: want none, latest, latest-if-any or a checkpoint id, not %q", restore)
	}
	return j.records.Get(ctx, kindCommitted, id)
}

// latest returns the newest committed checkpoint record, after rolling forward a prepared
// record whose deciding sinks committed.
func (j *Job) latest(ctx context.Context) (*CheckpointRecord, error) {
	if err := j.rollForward(ctx); err != nil {
		return nil, err
	}
	ids, err := j.records.List(ctx, kindCommitted)
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints: %w", err)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("job %s: %w", j.spec.Name, ErrNoCheckpoint)
	}
	return j.records.Get(ctx, kindCommitted, ids[len(ids)-1])
}

// rollForward commits each prepared record newer than the newest committed one whose
// deciding sinks all report it decided, and deletes the others (their transactions were
// never committed, and the sinks abort them in Recover).
func (j *Job) rollForward(ctx context.Context) error {
	prepared, err := j.records.List(ctx, kindPrepared)
	if err != nil || len(prepared) == 0 {
		return err
	}
	var deciding []DecidingSink
	for _, s := range j.sinks {
		if d, ok := s.Committer().(DecidingSink); ok {
			deciding = append(deciding, d)
		}
	}
	decided := uint64(math.MaxUint64)
	for _, d := range deciding {
		n, err := d.Decided(ctx)
		if err != nil {
			return fmt.Errorf("asking a sink which checkpoint it committed: %w", err)
		}
		decided = min(decided, n)
	}
	if len(deciding) == 0 {
		decided = 0
	}
	committed, err := j.records.List(ctx, kindCommitted)
	if err != nil {
		return err
	}
	var newest uint64
	if len(committed) > 0 {
		newest = committed[len(committed)-1]
	}
	for _, id := range prepared {
		// Only a prepared record newer than every committed one can be the one a crash left
		// between its decision and its commit. An older one is a leftover (a zombie's, or an
		// attempt that a later checkpoint superseded): committing it would put a false record
		// among the true ones, so it is only deleted.
		if id <= decided && id > newest {
			rec, err := j.records.Get(ctx, kindPrepared, id)
			if err != nil {
				return err
			}
			if err := j.records.Put(ctx, kindCommitted, rec); err != nil && !errors.Is(err, ErrRecordExists) {
				return fmt.Errorf("rolling checkpoint %d forward: %w", id, err)
			}
		}
		if err := j.records.Delete(ctx, kindPrepared, id); err != nil {
			return err
		}
	}
	return nil
}

func (j *Job) restartDelay(n int) time.Duration {
	r := j.spec.Restart
	d := r.Delay.D()
	if r.Strategy == "exponential-backoff" {
		f := float64(d) * math.Pow(r.Multiplier, float64(n-1))
		d = time.Duration(min(f, float64(r.MaxDelay.D())))
	}
	return d
}

// loop runs attempts: the first from the requested restore, each restart from the newest
// committed checkpoint.
func (j *Job) loop(restore *CheckpointRecord) {
	defer close(j.done)
	defer j.closeResources(context.Background())
	ctx := j.runCtx
	for {
		j.mu.Lock()
		j.attempts++
		if restore != nil {
			j.restored = restore.ID
		}
		j.mu.Unlock()
		err := j.runAttempt(ctx, restore)
		if err == nil {
			if j.stopping.Load() {
				j.finish(JobStopped, nil)
			} else {
				j.finish(JobFinished, nil)
			}
			return
		}
		if errors.Is(context.Cause(ctx), ErrStopped) {
			j.finish(JobStopped, nil)
			return
		}
		j.mu.Lock()
		restarts := j.restarts
		j.mu.Unlock()
		if j.spec.Restart.Strategy == "none" || restarts >= j.spec.Restart.Attempts || ctx.Err() != nil || !restartable(err) {
			j.finish(JobFailed, err)
			return
		}
		j.mu.Lock()
		j.restarts++
		j.state = JobRestarting
		j.mu.Unlock()
		delay := j.restartDelay(restarts + 1)
		j.env.Log.Warn("job failed; restarting from the last checkpoint", "job", j.spec.Name, "err", err, "restart", restarts+1, "delay", delay)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			j.finish(JobFailed, err)
			return
		}
		rec, rerr := j.latest(ctx)
		switch {
		case errors.Is(rerr, ErrNoCheckpoint):
			restore = nil
		case rerr != nil:
			j.finish(JobFailed, fmt.Errorf("%w (and restoring failed: %w)", err, rerr))
			return
		default:
			restore = rec
		}
	}
}

// restartable reports whether trying again may help: spec and compatibility errors do not go
// away by restarting.
func restartable(err error) bool {
	var se *SpecError
	return !errors.As(err, &se) && !errors.Is(err, ErrStateVersion) && !errors.Is(err, ErrMigration)
}

func (j *Job) runAttempt(ctx context.Context, restore *CheckpointRecord) error {
	no, err := j.records.ClaimAttempt(ctx)
	if err != nil {
		return err
	}
	a := &attempt{job: j, spec: j.spec, env: &j.env, log: j.env.Log.With("job", j.spec.Name, "attempt", no),
		specSHA: j.specSHA, attemptNo: no, records: j.records, restored: restore, sources: j.sources, sinks: j.sinks, ops: j.ops}
	return a.run(ctx)
}

func (j *Job) setAttempt(a *attempt) {
	j.mu.Lock()
	j.cur = a
	j.state = JobRunning
	j.mu.Unlock()
}

func (j *Job) noteCheckpoint(info CheckpointInfo) {
	j.env.flag.checkpointDone(info)
	j.mu.Lock()
	j.last = &info
	j.mu.Unlock()
}

func (j *Job) finish(s JobState, err error) {
	m := j.Metrics()
	j.mu.Lock()
	j.state, j.err = s, err
	m.State = s
	if err != nil {
		m.Error = err.Error()
	}
	j.finalInfo = m
	j.cur = nil
	j.mu.Unlock()
}

func (j *Job) closeResources(ctx context.Context) {
	for _, o := range j.ops {
		if !o.borrowed {
			o.eng.Close(context.WithoutCancel(ctx))
		}
	}
	if j.ownsSt && j.store != nil {
		j.store.Close()
	}
}

// ErrStopped is the cause of a job stopped without a savepoint.
var ErrStopped = errors.New("the job was stopped")

// ErrNotRunning refuses a savepoint of a job that has ended or is restarting.
var ErrNotRunning = errors.New("the job is not running")

// Savepoint takes a savepoint now and returns its checkpoint id once it is committed.
func (j *Job) Savepoint(ctx context.Context) (uint64, error) {
	return j.request(ctx, request{savepoint: true})
}

// Stop ends the job. With savepoint, the sources stop, a final savepoint is committed and the
// job drains (the id is returned); without, the job is cancelled at once and its output ends at
// the last committed checkpoint.
func (j *Job) Stop(ctx context.Context, savepoint bool) (uint64, error) {
	if !savepoint {
		j.cancel(ErrStopped)
		select {
		case <-j.done:
			return 0, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	j.stopping.Store(true)
	id, err := j.request(ctx, request{stop: true, savepoint: true})
	if err != nil {
		return 0, err
	}
	select {
	case <-j.done:
	case <-ctx.Done():
		return id, ctx.Err()
	}
	return id, nil
}

func (j *Job) request(ctx context.Context, r request) (uint64, error) {
	r.reply = make(chan savepointReply, 1)
	select {
	case j.requests <- r:
	case <-j.done:
		return 0, ErrNotRunning
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	select {
	case rep := <-r.reply:
		return rep.id, rep.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// Wait blocks until the job ends and returns its final metrics and error.
func (j *Job) Wait() (JobMetrics, error) {
	<-j.done
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.finalInfo, j.err
}

// Done is closed when the job has ended.
func (j *Job) Done() <-chan struct{} { return j.done }

// JobMetrics is a snapshot of a job.
type JobMetrics struct {
	Job      string
	State    JobState
	Error    string `json:",omitempty"`
	Attempts int
	Restarts int
	// Restored is the checkpoint the latest attempt started from (0: fresh).
	Restored       uint64
	Uptime         time.Duration
	LastCheckpoint *CheckpointInfo `json:",omitempty"`
	Sources        []SubtaskMetrics
	Operators      []SubtaskMetrics
	Sinks          []SubtaskMetrics
}

// SubtaskMetrics describes one subtask.
type SubtaskMetrics struct {
	Node    string
	Subtask int
	// RecordsIn counts records completed (operators), read (sources) or written (sinks).
	RecordsIn  int64
	RecordsOut int64
	// InputDepth is the number of batches waiting in the subtask's input channels.
	InputDepth int
	// Late counts late records diverted or dropped at the operator's input.
	Late    int64
	Skipped int64
	// DeadLetters counts records whose guest call faulted and that went to NAME.errors.
	DeadLetters int64 `json:",omitempty"`
	// Retries counts the guest calls run again after a fault without effect (retries).
	Retries   int64 `json:",omitempty"`
	InFlight  int64
	Suspended int64
}

// Metrics returns a snapshot of the job.
func (j *Job) Metrics() JobMetrics {
	j.mu.Lock()
	if j.cur == nil && j.state != JobRunning && j.finalInfo.Job != "" {
		m := j.finalInfo
		j.mu.Unlock()
		return m
	}
	a := j.cur
	m := JobMetrics{Job: j.spec.Name, State: j.state, Attempts: j.attempts, Restarts: j.restarts, Restored: j.restored,
		Uptime: time.Since(j.started)}
	if j.last != nil {
		l := *j.last
		m.LastCheckpoint = &l
	}
	j.mu.Unlock()
	if a == nil {
		return m
	}
	for _, t := range a.srcTasks {
		m.Sources = append(m.Sources, SubtaskMetrics{Node: t.spec.Name, Subtask: t.subtask, RecordsIn: t.records.Load(),
			RecordsOut: t.out.records.Load(), Skipped: t.skipped.Load()})
	}
	for _, t := range a.opTasks {
		sm := SubtaskMetrics{Node: t.op.spec.Name, Subtask: t.subtask, RecordsOut: t.out.records.Load(), InputDepth: t.in.depth(), Late: t.in.dropped.Load(), DeadLetters: t.deadLetters.Load()}
		if c := t.ctrl.Load(); c != nil {
			cm := c.Metrics()
			// The scheduler counts guest calls, a retried record's attempts included.
			sm.RecordsIn, sm.InFlight, sm.Suspended, sm.Retries = cm.Records-cm.RecordRetries, cm.InFlight, cm.Suspended, cm.RecordRetries
		}
		m.Operators = append(m.Operators, sm)
	}
	for _, t := range a.sinkOrder {
		if t.task != nil {
			m.Sinks = append(m.Sinks, SubtaskMetrics{Node: t.task.name, Subtask: t.task.subtask, RecordsIn: t.task.records.Load(), InputDepth: t.task.in.depth()})
		} else { // chained: no input of its own
			m.Sinks = append(m.Sinks, SubtaskMetrics{Node: t.chained.name, Subtask: t.chained.subtask, RecordsIn: t.chained.records.Load()})
		}
	}
	return m
}

// jobLogger is the job's log, naming the job (nil without one: the store's default discards).
func jobLogger(l *slog.Logger, spec *Spec) *slog.Logger {
	if l == nil {
		return nil
	}
	if spec.Tenant != "" {
		return l.With("job", spec.Name, "tenant", spec.Tenant)
	}
	return l.With("job", spec.Name)
}
