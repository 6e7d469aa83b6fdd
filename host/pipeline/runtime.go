package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// attemptStride separates the checkpoint ids of attempts: checkpoint s of attempt a is
// a*attemptStride + s, so an attempt never reuses an id an earlier one may have half-written
// to the state pool.
const attemptStride = 1_000_000_000

// attempt is one run of a job's graph, from a restore (or the beginning) to its end or first
// failure. A restart is a new attempt.
type attempt struct {
	job       *Job
	spec      *Spec
	env       *Env
	log       *slog.Logger
	specSHA   string
	attemptNo uint64
	records   recordStore
	restored  *CheckpointRecord // nil: fresh start

	sources map[string]Source
	sinks   map[string]Sink
	ops     []*opNode
	coord   *coordinator
	ctx     context.Context // the attempt's; cancelled at its first failure

	srcTasks []*sourceTask
	opTasks  []*operatorTask
	skTasks  []*sinkTask
	chained  []*chainedSink // sink subtasks run by their operator subtask (chain.go)
	batches  *batchPool     // the pooled channels' batches (batchpool.go)
	// sinkOrder is every sink subtask, in the spec's order, for metrics: one of the two set.
	sinkOrder []sinkSubtask
}

// sinkSubtask is a sink subtask of its own (task) or one chained to its input (chained).
type sinkSubtask struct {
	task    *sinkTask
	chained *chainedSink
}

// opNode is a loaded operator.
type opNode struct {
	spec      *OperatorSpec
	mod       *abi.Module
	eng       *abi.Engine
	sha       string
	stateName string
	ranges    []state.KeyGroupRange
	borrowed  bool                       // eng belongs to the caller (the flag form's preloaded module)
	live      atomic.Pointer[LimitsSpec] // limits changed while the job runs (live.go)
}

func (a *attempt) sourceSpec(name string) *SourceSpec {
	for i := range a.spec.Sources {
		if a.spec.Sources[i].Name == name {
			return &a.spec.Sources[i]
		}
	}
	return nil
}

func (a *attempt) sinkSpec(name string) *SinkSpec {
	for i := range a.spec.Sinks {
		if a.spec.Sinks[i].Name == name {
			return &a.spec.Sinks[i]
		}
	}
	return nil
}

// eventTime reports whether some source of the job has event time (watermarks before the end).
func (a *attempt) eventTime() bool {
	for i := range a.spec.Sources {
		if a.spec.Sources[i].EventTime != nil {
			return true
		}
	}
	return false
}

// nodeParallelism returns the parallelism of a source or operator.
func (a *attempt) nodeParallelism(name string) int {
	if s := a.sourceSpec(name); s != nil {
		return s.Parallelism
	}
	return a.spec.Operator(name).Parallelism
}

// outputs of one upstream node: per output ("" main, or a side output), the edges leaving
// each upstream subtask.
type wiring struct {
	// out[node][output][subtask] are the edgeOuts of that upstream subtask.
	out map[string]map[string][][]*edgeOut
	// in[node][subtask] are the input channels of a downstream subtask.
	in map[string][][]*channel
	// chained[sink][subtask] are the sink subtasks chained to their input (chain.go).
	chained map[string][]*chainedSink
	closers []func()
}

// wire builds every edge's channels.
func (a *attempt) wire(ctx context.Context) (*wiring, error) {
	w := &wiring{out: map[string]map[string][][]*edgeOut{}, in: map[string][][]*channel{}, chained: map[string][]*chainedSink{}}
	kg := a.spec.KeyGroups
	connect := func(downName string, downPar int, inputs []string, key *KeySpec, chain bool, down *opNode) error {
		ins := make([][]*channel, downPar)
		for _, input := range inputs {
			up, side, _ := strings.Cut(input, ".")
			upPar := a.nodeParallelism(up)
			if w.out[up] == nil {
				w.out[up] = map[string][][]*edgeOut{}
			}
			if w.out[up][side] == nil {
				w.out[up][side] = make([][]*edgeOut, upPar)
			}
			forward := chain
			for u := range upPar {
				var kf keyFunc
				if !forward && key != nil {
					switch {
					case key.Field != "":
						kf = fieldKey(key.Field, down.eng.Limits().MaxRecordKey)
					case key.Guest:
						fn, closeFn, err := guestKey(ctx, down.mod)
						if err != nil {
							return fmt.Errorf("operator %s: the key function: %w", downName, err)
						}
						kf = fn
						w.closers = append(w.closers, closeFn)
					}
				}
				var chans []*channel
				if forward {
					c := newChannel(fmt.Sprintf("%s[%d]", input, u), fmt.Sprintf("%s[%d]", downName, u))
					c.side = side != ""
					chans = []*channel{c}
					ins[u] = append(ins[u], c)
				} else {
					for d := range downPar {
						c := newChannel(fmt.Sprintf("%s[%d]", input, u), fmt.Sprintf("%s[%d]", downName, d))
						c.side = side != ""
						chans = append(chans, c)
						ins[d] = append(ins[d], c)
					}
				}
				e := newEdgeOut(forward, kf, chans, downPar, kg)
				if forward {
					e.kgOwner = nil
					e.par = downPar
					e.ownerCheck(kg)
				} else if key == nil {
					// A sink, or an operator with a single subtask: by the record's incoming
					// key (its hash), so that each key's records keep their order.
					e.keyOf = nil
					if down != nil && down.spec.Order != "per-key" && downPar > 1 {
						// An unkeyed operator (order input or none): round robin, each upstream
						// subtask starting at its own offset. Order holds per subtask only.
						e.roundRobin, e.next = true, u%downPar
					}
				}
				w.out[up][side][u] = append(w.out[up][side][u], e)
			}
		}
		w.in[downName] = ins
		return nil
	}
	for _, op := range a.ops {
		if err := connect(op.spec.Name, op.spec.Parallelism, op.spec.Inputs, op.spec.Key, op.spec.Chain, op); err != nil {
			return nil, err
		}
	}
	for i := range a.spec.Sinks {
		sk := &a.spec.Sinks[i]
		if a.chainable(sk) {
			up := sk.Inputs[0]
			if w.out[up] == nil {
				w.out[up] = map[string][][]*edgeOut{}
			}
			if w.out[up][""] == nil {
				w.out[up][""] = make([][]*edgeOut, sk.Parallelism)
			}
			for u := range sk.Parallelism {
				cs := &chainedSink{a: a, name: sk.Name, subtask: u}
				w.chained[sk.Name] = append(w.chained[sk.Name], cs)
				w.out[up][""][u] = append(w.out[up][""][u], &edgeOut{forward: true, sink: cs})
			}
			continue
		}
		// Other sinks take their inputs hashed by the emitted key, so each key's records keep
		// their order through one sink subtask.
		if err := connect(sk.Name, sk.Parallelism, sk.Inputs, nil, false, nil); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// ownerCheck prepares a forward edge's key-group check (a chained operator must receive only
// keys of its own key groups).
func (e *edgeOut) ownerCheck(numKG int) {
	e.kgOwner = make([]int, numKG)
	for i := range e.par {
		r := state.KeyGroupRangeFor(i, e.par, numKG)
		for kg := r.Lo; kg < r.Hi; kg++ {
			e.kgOwner[kg] = i
		}
	}
}

// routerFor returns the router of an upstream subtask.
func (w *wiring) routerFor(ctx context.Context, a *attempt, node string, subtask int) *router {
	r := &router{name: fmt.Sprintf("%s[%d]", node, subtask), ctx: ctx, log: a.log, stuckAfter: a.env.stuckAfter(), subtask: subtask, side: map[string][]*edgeOut{}}
	for output, per := range w.out[node] {
		if output == "" {
			r.main = per[subtask]
		} else {
			r.side[output] = per[subtask]
		}
	}
	return r
}

// run executes the attempt to the end of a bounded input (nil), a stop, or its first failure.
func (a *attempt) run(parent context.Context) error {
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	a.ctx = ctx
	w, err := a.wire(ctx)
	if err != nil {
		return err
	}
	defer func() {
		for _, c := range w.closers {
			c()
		}
	}()
	store := a.job.store
	numKG := a.spec.KeyGroups
	nChan := 0
	for _, ins := range w.in {
		for _, cs := range ins {
			nChan += len(cs)
		}
	}
	// Idle batches kept: enough for every channel's to come back at once.
	a.batches = newBatchPool(reuseDistance + 16 + nChan*(channelBatches+2))

	nSrc, nOp, nSink := 0, 0, 0
	for _, s := range a.spec.Sources {
		nSrc += s.Parallelism
	}
	for _, op := range a.ops {
		nOp += op.spec.Parallelism
	}
	for _, s := range a.spec.Sinks {
		nSink += s.Parallelism
	}
	c := &coordinator{a: a, log: a.log, triggers: map[string][]chan trigger{}, acks: make(chan ack, 2*(nSrc+nOp+nSink)+8),
		requests: a.job.requests, nSources: nSrc, nOps: nOp, nSinks: nSink, interval: a.spec.Checkpoints.Interval.D(),
		timeout: a.spec.Checkpoints.Timeout.D(), infos: map[uint64]trigger{}}
	a.coord = c

	// Recover the sinks before anything is written: re-commit the restored checkpoint's
	// output, discard the rest.
	for _, sk := range a.spec.Sinks {
		if cm := a.sinks[sk.Name].Committer(); cm != nil {
			var id uint64
			var prep []byte
			if a.restored != nil {
				id = a.restored.ID
				if sc := a.restored.Sinks[sk.Name]; sc != nil {
					prep = sc.Prepared
				}
			}
			if err := cm.Recover(ctx, id, prep); err != nil {
				return fmt.Errorf("recovering sink %s: %w", sk.Name, err)
			}
		}
	}

	var wg sync.WaitGroup
	errs := make(chan error, nSrc+nOp+nSink+1)
	launch := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				// A bug in a subtask fails the attempt with an error; it must not take down
				// the process and every other pipeline in it.
				if p := recover(); p != nil {
					err := fmt.Errorf("pipeline: internal error (please report it): %v", p)
					errs <- err
					cancel(err)
				}
			}()
			if err := f(); err != nil {
				errs <- err
				cancel(err)
			}
		}()
	}

	// Operators: open every subtask's backend first, so that a restore failure stops the
	// attempt before any record moves.
	for _, op := range a.ops {
		var restoreFrom uint64
		if a.restored != nil {
			oc := a.restored.Operators[op.spec.Name]
			if oc == nil {
				return fmt.Errorf("checkpoint %d has no state for operator %s (was it added since? start it fresh with a new name)", a.restored.ID, op.spec.Name)
			}
			if err := checkCompatible(oc, op, numKG, a.restored); err != nil {
				return err
			}
			if v := op.mod.Manifest.StateVersion; v != oc.StateVersion && !op.mod.HasMigrate() {
				a.log.Info("restoring an older state version: the module migrates it", "operator", op.spec.Name,
					"checkpoint", a.restored.ID, "from_version", oc.StateVersion, "to_version", v)
			}
			restoreFrom = oc.StateCheckpoint
		}
		for i := range op.spec.Parallelism {
			b, err := store.Operator(ctx, state.OperatorOptions{Name: op.stateName, Tenant: a.spec.Tenant, NumKeyGroups: numKG,
				KeyGroups: op.ranges[i], RestoreFrom: restoreFrom})
			if err != nil {
				if restoreFrom != 0 {
					return fmt.Errorf("restoring operator %s[%d] from checkpoint %d: %w", op.spec.Name, i, restoreFrom, err)
				}
				return fmt.Errorf("opening the state of operator %s[%d]: %w", op.spec.Name, i, err)
			}
			if err := b.Open(op.mod.Manifest.States); err != nil {
				b.Close()
				return fmt.Errorf("state of operator %s: %w", op.spec.Name, err)
			}
			if err := remapTimers(b); err != nil {
				b.Close()
				return fmt.Errorf("restoring the timers of operator %s[%d]: %w", op.spec.Name, i, err)
			}
			if err := remapCapturedInput(b); err != nil {
				b.Close()
				return fmt.Errorf("restoring the captured input of operator %s[%d]: %w", op.spec.Name, i, err)
			}
			t := &operatorTask{a: a, op: op, subtask: i, backend: b, in: newMerger(w.in[op.spec.Name][i]), out: w.routerFor(ctx, a, op.spec.Name, i)}
			if a.env.flag.recording() == nil { // a recording keeps what it taps: no reuse
				t.in.pool(a.batches)
			}
			t.in.checkLate = a.env.flag == nil // the flag form hands late records to its operator, as it always did
			t.in.eventTime = a.eventTime()
			if op.spec.Late == "side-output" {
				t.lateOut = t.out.sideRouter("late")
				t.in.late, t.in.lateFlush = t.lateRecord, t.lateOut.flush
			}
			a.opTasks = append(a.opTasks, t)
		}
	}
	defer func() {
		for _, t := range a.opTasks {
			t.backend.Close()
		}
	}()
	if err := a.migrateRestored(ctx); err != nil {
		return err
	}
	for _, sk := range a.spec.Sinks {
		for i := range sk.Parallelism {
			var ckpt uint64
			if a.restored != nil {
				ckpt = a.restored.ID
			}
			wr, err := a.sinks[sk.Name].Open(ctx, SinkContext{Job: a.spec.Name, Tenant: a.spec.Tenant, Name: sk.Name, Subtask: i, Parallelism: sk.Parallelism, Checkpoint: ckpt})
			if err != nil {
				return fmt.Errorf("opening sink %s[%d]: %w", sk.Name, i, err)
			}
			if cs := w.chained[sk.Name]; cs != nil {
				cs[i].w = wr
				a.chained = append(a.chained, cs[i])
				a.sinkOrder = append(a.sinkOrder, sinkSubtask{chained: cs[i]})
				continue
			}
			t := &sinkTask{a: a, name: sk.Name, subtask: i, w: wr, in: newMerger(w.in[sk.Name][i])}
			t.in.pool(a.batches)
			a.skTasks = append(a.skTasks, t)
			a.sinkOrder = append(a.sinkOrder, sinkSubtask{task: t})
		}
	}
	launched := false
	defer func() {
		if !launched { // a setup failure: close what was opened
			for _, t := range a.srcTasks {
				t.r.Close()
			}
			for _, t := range a.skTasks {
				t.w.Close(context.WithoutCancel(ctx))
			}
			for _, s := range a.chained {
				s.abandon(ctx)
			}
		}
	}()
	for si := range a.spec.Sources {
		ss := &a.spec.Sources[si]
		src := a.sources[ss.Name]
		ids, err := src.Splits(ctx)
		if err != nil {
			return fmt.Errorf("source %s: listing splits: %w", ss.Name, err)
		}
		pos := map[string][]byte{}
		if a.restored != nil {
			sc := a.restored.Sources[ss.Name]
			if sc == nil {
				return fmt.Errorf("checkpoint %d has no positions for source %s", a.restored.ID, ss.Name)
			}
			for _, sp := range sc.Splits {
				pos[sp.ID] = sp.Position
			}
		}
		for i := range ss.Parallelism {
			var mine []Split
			for j, id := range ids {
				if j%ss.Parallelism == i {
					mine = append(mine, Split{ID: id, Position: pos[id]})
				}
			}
			rd, err := src.Open(ctx, mine)
			if err != nil {
				return fmt.Errorf("opening source %s[%d]: %w", ss.Name, i, err)
			}
			trig := make(chan trigger, 4)
			c.triggers[ss.Name] = append(c.triggers[ss.Name], trig)
			t := &sourceTask{a: a, spec: ss, subtask: i, r: rd, splits: mine, trig: trig, out: w.routerFor(ctx, a, ss.Name, i)}
			a.srcTasks = append(a.srcTasks, t)
		}
	}
	a.job.setAttempt(a)
	launched = true

	coordDone := make(chan error, 1)
	go func() {
		err := c.run(ctx)
		if err != nil {
			cancel(err)
		}
		coordDone <- err
	}()
	for _, t := range a.skTasks {
		launch(t.run)
	}
	for _, t := range a.opTasks {
		launch(t.run)
	}
	for _, t := range a.srcTasks {
		launch(t.run)
	}
	wg.Wait()
	close(errs)
	cerr := <-coordDone
	first := firstError(errs, cerr)
	if first == nil && parent.Err() != nil {
		first = context.Cause(parent)
	}
	return first
}

// firstError picks the error that explains the failure: an operator's fault or a bad output
// over the cancellations it caused (an operator call cancelled by them included).
func firstError(errs <-chan error, coord error) error {
	var all []error
	for e := range errs {
		all = append(all, e)
	}
	if coord != nil {
		all = append(all, coord)
	}
	var oe *scheduler.OperatorError
	var f *abi.Fault
	for _, e := range all {
		if !errors.As(e, &oe) {
			continue
		}
		// A call stopped because another part failed (a sink that could not write: its
		// error reaches the guest's emit) is explained by that failure, reported as is.
		for _, o := range all {
			if o != e && !errors.As(o, new(*scheduler.OperatorError)) && !errors.As(o, new(*abi.Fault)) && errors.Is(e, o) {
				return o
			}
		}
		// A call cancelled mid-way is the consequence of another failure (the coordinator's),
		// which explains it better.
		if !(errors.As(e, &f) && f.Kind == abi.FaultCancelled) {
			return e
		}
	}
	for _, e := range all {
		if !errors.Is(e, context.Canceled) && !errors.Is(e, errAttemptCancelled) {
			return e
		}
	}
	if len(all) > 0 {
		return all[0]
	}
	return nil
}

var errAttemptCancelled = errors.New("attempt cancelled")

// checkCompatible refuses to restore an operator whose state cannot carry over.
func checkCompatible(oc *OperatorCheckpoint, op *opNode, numKG int, rec *CheckpointRecord) error {
	if rec.KeyGroups != numKG {
		return fmt.Errorf("checkpoint %d has %d key groups and the spec %d: key_groups is fixed for the life of a job's state", rec.ID, rec.KeyGroups, numKG)
	}
	if oc.StateName != op.stateName {
		return fmt.Errorf("operator %s: checkpoint %d holds state %q, not %q", op.spec.Name, rec.ID, oc.StateName, op.stateName)
	}
	// A module may add states; the ones it drops are ignored (state is keyed by name).
	return checkStateVersion(op.spec.Name, rec.ID, oc, op.mod.Manifest)
}

// ErrStateVersion refuses a restore into a module that cannot read the checkpoint's state
// version (docs/abi.md, "State versions on restore").
var ErrStateVersion = errors.New("state version mismatch")

// checkStateVersion lets a module restore state of its own version, or of one it migrates
// from.
func checkStateVersion(operator string, checkpoint uint64, oc *OperatorCheckpoint, m abi.Manifest) error {
	if m.Migrates(oc.StateVersion) {
		return nil
	}
	return fmt.Errorf("%w: operator %s: checkpoint %d holds state version %d (written by module %s), and module %s declares state_version %d without %d in migrates_from: "+
		"it cannot read that state. Declare the migration in the module's manifest (\"migrates_from\": [%d]) and convert old values as it reads them, or start without restoring",
		ErrStateVersion, operator, checkpoint, oc.StateVersion, oc.Module, m.Name, m.StateVersion, oc.StateVersion, oc.StateVersion)
}

// moduleSHA is the hex sha256 of a module's bytes.
func moduleSHA(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// loadOperators compiles every operator's module under its limits.
func loadOperators(ctx context.Context, spec *Spec, env *Env) ([]*opNode, error) {
	var out []*opNode
	fail := func(err error) ([]*opNode, error) {
		for _, o := range out {
			if !o.borrowed {
				o.eng.Close(context.WithoutCancel(ctx))
			}
		}
		return nil, err
	}
	for i := range spec.Operators {
		os := &spec.Operators[i]
		path := fmt.Sprintf("operators[%d]", i)
		var n *opNode
		if f := env.flag; f != nil { // the flag form loaded its one module already
			n = &opNode{spec: os, mod: f.mod, eng: f.eng, sha: moduleSHA(f.bin), stateName: spec.Name + "." + os.Name, borrowed: true}
		} else {
			bin, err := env.module(ctx, os.Module)
			if err != nil {
				return fail(&SpecError{Problems: []*FieldError{{Path: path + ".module", Reason: err.Error()}}})
			}
			lim := abi.Limits{MemoryPages: os.Limits.MemoryPages, CallTime: os.Limits.CallTimeout.D(), MaxRecordValue: os.Limits.MaxRecordBytes}
			opts := []abi.EngineOption{abi.WithLimits(lim)}
			if env.CacheDir != "" {
				opts = append(opts, abi.WithCompilationCacheDir(env.CacheDir))
			}
			if env.CPUShare != nil {
				opts = append(opts, abi.WithCPUShare(env.CPUShare))
			}
			eng, err := abi.NewEngine(ctx, opts...)
			if err != nil {
				return fail(err)
			}
			mod, err := eng.Load(ctx, bin, abi.WithEndpoints(EndpointNames(os.Endpoints)...))
			if err != nil {
				eng.Close(context.WithoutCancel(ctx))
				return fail(&SpecError{Problems: []*FieldError{{Path: path + ".module", Reason: err.Error()}}})
			}
			n = &opNode{spec: os, mod: mod, eng: eng, sha: moduleSHA(bin), stateName: spec.Name + "." + os.Name}
		}
		mod := n.mod
		out = append(out, n)
		for j, st := range os.State {
			found := false
			for _, have := range mod.Manifest.States {
				found = found || have == st
			}
			if !found {
				return fail(&SpecError{Problems: []*FieldError{{Path: fmt.Sprintf("%s.state[%d]", path, j),
					Reason: fmt.Sprintf("module %s does not declare state %q (it declares %v)", mod.Name(), st, mod.Manifest.States)}}})
			}
		}
		if os.Order != "per-key" && len(mod.Manifest.States) > 0 {
			return fail(&SpecError{Problems: []*FieldError{{Path: path + ".order",
				Reason: fmt.Sprintf("module %s declares keyed state (%v), which needs order per-key: order %s runs the records of a key concurrently (and, at parallelism > 1, on any subtask)", mod.Name(), mod.Manifest.States, os.Order)}}})
		}
		if os.Key != nil && os.Key.Guest && !mod.HasKey() {
			return fail(&SpecError{Problems: []*FieldError{{Path: path + ".key.guest", Reason: fmt.Sprintf("module %s does not export clink_key", mod.Name())}}})
		}
		for s := range os.Parallelism {
			n.ranges = append(n.ranges, state.KeyGroupRangeFor(s, os.Parallelism, spec.KeyGroups))
		}
	}
	return out, nil
}

func (e *Env) stuckAfter() time.Duration {
	if e.StuckAfter > 0 {
		return e.StuckAfter
	}
	return 5 * time.Second
}
