// Package cluster runs a pipeline on several machines. Each worker is a member of the Kafka
// consumer group of the pipeline's source and runs one task, a complete pipeline job, per
// input partition it owns; the group decides who owns what, the pipeline's checkpoints with
// the Kafka transactional sink give exactly once, and S3 holds every partition's state, read
// lazily by whoever owns it next. docs/SCALING.md has the protocol and its failure points.
//
//	w, err := cluster.New(cluster.Options{Spec: spec, Env: env, NewConnectors: conns})
//	err = w.Run(ctx) // until ctx ends: then every task takes a final checkpoint and the
//	                 // worker leaves the group
//
// On revoke, a task stops with a final savepoint: its source stops, its in-flight records
// drain, the state delta of its key groups is uploaded, its Kafka transaction (outputs,
// offsets, marker) commits and its checkpoint record is written, all before the partition is
// released to the group. Tasks of partitions the worker keeps go on running. On assign, a
// task restores its partition's newest checkpoint (rolling a decided one forward), which
// fences the partition's previous owner, and resumes from the offsets it names.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/clink-wasm/clink-wasm/host/connector/kafka"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// Group protocols.
const (
	// ProtocolClassic is the classic group protocol with the cooperative-sticky balancer
	// (the default; docs/SCALING.md says why).
	ProtocolClassic = "classic"
	// ProtocolConsumer is KIP-848's broker-side assignment (Kafka 4.0+).
	ProtocolConsumer = "consumer"
)

// Options configure a worker.
type Options struct {
	// Spec is the pipeline (one Kafka source; no re-keying).
	Spec *pipeline.Spec
	// Env is the environment tasks run in. Its Connectors, StateURL, Restore and Store are
	// set per task.
	Env pipeline.Env
	// NewConnectors returns a registry of every connector type; it is called once per task
	// start (the task's Kafka source is wrapped to read only its partition).
	NewConnectors func() *pipeline.Connectors
	// StateURL is the base of the partitions' state pools when the spec names none.
	StateURL string
	// Group is the consumer group (default: the Kafka source's group option, else "clink." +
	// the spec's name). Each task's transactions also commit its partition's offsets to it.
	Group string
	// Protocol is ProtocolClassic (default) or ProtocolConsumer.
	Protocol string
	// SessionTimeout, HeartbeatInterval and RebalanceTimeout are the group's (defaults 10s,
	// 250ms, 60s). A revoke must finish its tasks' final checkpoints within RebalanceTimeout.
	// A member learns of a rebalance at its next heartbeat, so the interval is part of every
	// join's hand-over (Kafka's default, 3s, would dominate it).
	SessionTimeout, HeartbeatInterval, RebalanceTimeout time.Duration
	// RestartDelay is how long a failed task waits before it restarts, if the worker still
	// owns its partition (default: the larger of 1s and two heartbeat intervals, so that a
	// zombie learns of its loss before it would fence the real owner).
	RestartDelay time.Duration
	// Log receives the worker's events (default: discarded).
	Log *slog.Logger
	// OnEvent, if set, is called for every task event (tests, benchmarks, metrics).
	OnEvent func(Event)
}

// EventKind names what happened to a task.
type EventKind string

const (
	TaskAssigned EventKind = "assigned" // the group gave the worker the partition
	TaskStarted  EventKind = "started"  // the task restored and runs
	TaskFailed   EventKind = "failed"   // the task's job failed (Err); it restarts while owned
	TaskReleased EventKind = "released" // revoked: final checkpoint committed (Checkpoint), stopped
	TaskLost     EventKind = "lost"     // lost (session expired, fenced): stopped without a checkpoint
)

// Event is one task event.
type Event struct {
	Kind       EventKind
	Partition  int32
	Checkpoint uint64        // released: the final checkpoint; started: the restored one (0: fresh)
	Took       time.Duration // started: Start's duration; released: the stop's
	Err        error
}

// Worker is one member of a pipeline's consumer group.
type Worker struct {
	o      Options
	src    kafka.SourceConfig
	topic  string
	base   string
	log    *slog.Logger
	delay  time.Duration
	parts  int32
	stopTO time.Duration

	mu    sync.Mutex
	tasks map[int32]*task
	fatal context.CancelCauseFunc // ends Run with a permanent task error

	revoking atomic.Int32 // revokes in progress
}

// Revoking reports whether a revoke is in progress (its tasks are taking their final
// checkpoints): fault-injection hooks use it to crash at a step of a revoke.
func (w *Worker) Revoking() bool { return w.revoking.Load() > 0 }

// New checks the spec can be scaled out and returns a worker for it.
func New(o Options) (*Worker, error) {
	if o.Spec == nil || o.NewConnectors == nil {
		return nil, errors.New("cluster: Options.Spec and Options.NewConnectors are required")
	}
	o.Spec.ApplyDefaults()
	if err := o.Spec.Validate(); err != nil {
		return nil, err
	}
	if len(o.Spec.Name) > maxJobName {
		return nil, fmt.Errorf("%w: name: a scaled-out job's name has at most %d characters (each partition's task is NAME-pNNNNN)", ErrNotScalable, maxJobName)
	}
	sc, err := scalable(o.Spec)
	if err != nil {
		return nil, err
	}
	w := &Worker{o: o, src: sc, topic: sc.Topics[0], log: o.Log, tasks: map[int32]*task{}}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	if w.o.Group == "" {
		w.o.Group = sc.Group
	}
	if w.o.Group == "" {
		w.o.Group = "clink." + o.Spec.Name
	}
	switch w.o.Protocol {
	case "":
		w.o.Protocol = ProtocolClassic
	case ProtocolClassic, ProtocolConsumer:
	default:
		return nil, fmt.Errorf("cluster: group protocol %q: want classic or consumer", w.o.Protocol)
	}
	w.o.SessionTimeout = cmp(w.o.SessionTimeout, 10*time.Second)
	w.o.HeartbeatInterval = cmp(w.o.HeartbeatInterval, 250*time.Millisecond)
	w.o.RebalanceTimeout = cmp(w.o.RebalanceTimeout, 60*time.Second)
	w.delay = cmp(w.o.RestartDelay, max(time.Second, 2*w.o.HeartbeatInterval))
	w.stopTO = w.o.RebalanceTimeout * 9 / 10
	w.base = o.Spec.State.URL
	if w.base == "" {
		w.base = o.StateURL
	}
	if w.base == "" {
		return nil, errors.New("cluster: a state URL is required (the spec's state.url or --state): every worker must reach the same pool")
	}
	if _, err := PartitionURL(w.base, o.Spec.Name, 0); err != nil {
		return nil, err
	}
	return w, nil
}

func cmp(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Group returns the consumer group's name.
func (w *Worker) Group() string { return w.o.Group }

// Owned returns the partitions the worker runs tasks for, ascending.
func (w *Worker) Owned() []int32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Sorted(maps.Keys(w.tasks))
}

func (w *Worker) owns(p int32) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.tasks[p]
	return ok
}

func (w *Worker) event(e Event) {
	w.log.Info("task "+string(e.Kind), "partition", e.Partition, "checkpoint", e.Checkpoint, "took", e.Took, "err", e.Err)
	if w.o.OnEvent != nil {
		w.o.OnEvent(e)
	}
}

// Run joins the group and runs the tasks of the partitions the group assigns, until ctx
// ends. Then the worker revokes everything (each task commits a final checkpoint) and leaves
// the group, so that its partitions move at once rather than after the session timeout.
func (w *Worker) Run(ctx context.Context) error {
	rctx, fatal := context.WithCancelCause(ctx)
	defer fatal(nil)
	w.mu.Lock()
	w.fatal = fatal
	w.mu.Unlock()
	if err := kafka.Check(ctx, w.src.Config, w.topic); err != nil {
		return err
	}
	adm, err := w.src.Config.NewClient()
	if err != nil {
		return err
	}
	md, err := kadm.NewClient(adm).Metadata(ctx, w.topic)
	adm.Close()
	if err != nil {
		return fmt.Errorf("describing topic %s: %w", w.topic, err)
	}
	w.parts = int32(len(md.Topics[w.topic].Partitions))
	if err := checkLayout(ctx, w.base, clusterRecord{Job: w.o.Spec.Name, Topic: w.topic, Partitions: w.parts, KeyGroups: w.o.Spec.KeyGroups}); err != nil {
		return err
	}
	opts := []kgo.Opt{
		kgo.ConsumerGroup(w.o.Group),
		kgo.ConsumeTopics(w.topic),
		kgo.DisableAutoCommit(),
		kgo.SessionTimeout(w.o.SessionTimeout),
		kgo.HeartbeatInterval(w.o.HeartbeatInterval),
		kgo.RebalanceTimeout(w.o.RebalanceTimeout),
		kgo.OnPartitionsAssigned(w.assigned),
		kgo.OnPartitionsRevoked(w.revoked),
		kgo.OnPartitionsLost(w.lost),
	}
	if w.o.Protocol == ProtocolConsumer {
		opts = append(opts, kgo.ServerSideBalancer(), kgo.Balancers(kgo.StickyBalancer()))
	} else {
		opts = append(opts, kgo.Balancers(kgo.CooperativeStickyBalancer()))
	}
	cl, err := w.src.Config.NewClient(opts...)
	if err != nil {
		return err
	}
	// The member only holds the assignment: each task reads its partition with its own
	// source, from its checkpoint's offsets. Nothing is fetched here.
	cl.PauseFetchTopics(w.topic)
	<-rctx.Done()
	// Leaving revokes every partition (OnPartitionsRevoked: final checkpoints), then leaves.
	cl.Close()
	w.mu.Lock()
	left := slices.Collect(maps.Values(w.tasks))
	w.tasks = map[int32]*task{}
	w.mu.Unlock()
	for _, t := range left {
		t.stop(false)
	}
	if err := context.Cause(rctx); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// fail ends Run with a permanent error (a spec a task cannot run: restarting cannot help).
func (w *Worker) fail(err error) {
	w.mu.Lock()
	f := w.fatal
	w.mu.Unlock()
	if f != nil {
		f(err)
	}
}

// kill ends the worker's tasks at once, without checkpoints, as a crash would (tests).
func (w *Worker) kill() {
	w.mu.Lock()
	left := slices.Collect(maps.Values(w.tasks))
	w.tasks = map[int32]*task{}
	w.mu.Unlock()
	for _, t := range left {
		t.stop(false)
	}
}

func (w *Worker) assigned(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	for _, p := range m[w.topic] {
		w.mu.Lock()
		if _, ok := w.tasks[p]; ok {
			w.mu.Unlock()
			continue
		}
		t := newTask(w, p)
		w.tasks[p] = t
		w.mu.Unlock()
		w.event(Event{Kind: TaskAssigned, Partition: p})
		go t.run()
	}
}

// revoked releases partitions: each task takes a final checkpoint (in parallel) before the
// callback returns, which is when the group may give the partitions to another member.
func (w *Worker) revoked(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	w.release(m[w.topic], true)
}

// lost drops partitions the worker no longer owns (its session expired, or the group
// fenced it): their tasks stop at once, without a checkpoint, since the new owner may be
// running already and would fence any commit anyway.
func (w *Worker) lost(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	w.release(m[w.topic], false)
}

func (w *Worker) release(parts []int32, savepoint bool) {
	if savepoint {
		w.revoking.Add(1)
		defer w.revoking.Add(-1)
	}
	var ts []*task
	w.mu.Lock()
	for _, p := range parts {
		if t, ok := w.tasks[p]; ok {
			ts = append(ts, t)
			delete(w.tasks, p)
		}
	}
	w.mu.Unlock()
	var wg sync.WaitGroup
	for _, t := range ts {
		wg.Go(func() { t.stop(savepoint) })
	}
	wg.Wait()
}
