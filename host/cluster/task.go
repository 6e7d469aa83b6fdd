package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// task runs partition p's job and restarts it after a failure while the worker owns p.
type task struct {
	w         *Worker
	p         int32
	ctx       context.Context
	cancel    context.CancelFunc
	savepoint atomic.Bool // how stop ends the job: with a final savepoint, or at once
	done      chan struct{}

	mu  sync.Mutex
	job *pipeline.Job // the current attempt's job (nil between attempts)
}

// currentJob returns the task's running job, or nil.
func (t *task) currentJob() *pipeline.Job {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.job
}

func (t *task) setJob(j *pipeline.Job) {
	t.mu.Lock()
	t.job = j
	t.mu.Unlock()
}

func newTask(w *Worker, p int32) *task {
	ctx, cancel := context.WithCancel(context.Background())
	return &task{w: w, p: p, ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

// stop ends the task and waits for it: with savepoint, its job commits a final checkpoint
// first.
func (t *task) stop(savepoint bool) {
	t.savepoint.Store(savepoint)
	t.cancel()
	<-t.done
}

func (t *task) run() {
	defer close(t.done)
	w := t.w
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(w.delay):
			case <-t.ctx.Done():
				return
			}
			if !w.owns(t.p) {
				return
			}
		}
		start := time.Now()
		job, restored, err := t.start()
		if err != nil {
			if t.ctx.Err() != nil {
				return
			}
			w.event(Event{Kind: TaskFailed, Partition: t.p, Err: err})
			var se *pipeline.SpecError
			if errors.As(err, &se) {
				w.fail(err)
				return
			}
			continue
		}
		t.setJob(job)
		w.event(Event{Kind: TaskStarted, Partition: t.p, Checkpoint: restored, Took: time.Since(start)})
		select {
		case <-job.Done():
			_, err := job.Wait()
			if err == nil {
				err = errors.New("the task's job ended (a Kafka source does not)")
			}
			t.setJob(nil)
			w.event(Event{Kind: TaskFailed, Partition: t.p, Err: err})
		case <-t.ctx.Done():
			t.finish(job)
			t.setJob(nil)
			return
		}
	}
}

// finish stops a running job as stop asked: with a final savepoint (revoke, leave), falling
// back to a plain stop when the savepoint fails; or at once (lost, kill).
func (t *task) finish(job *pipeline.Job) {
	w := t.w
	begin := time.Now()
	if t.savepoint.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), w.stopTO)
		id, err := job.Stop(ctx, true)
		cancel()
		if err == nil {
			_, err = job.Wait()
		}
		if err == nil {
			w.event(Event{Kind: TaskReleased, Partition: t.p, Checkpoint: id, Took: time.Since(begin)})
			return
		}
		_, _ = job.Stop(context.Background(), false)
		w.event(Event{Kind: TaskLost, Partition: t.p, Err: fmt.Errorf("final checkpoint on revoke: %w", err), Took: time.Since(begin)})
		return
	}
	_, _ = job.Stop(context.Background(), false)
	_, _ = job.Wait()
	w.event(Event{Kind: TaskLost, Partition: t.p, Took: time.Since(begin)})
}

// start restores partition p's newest checkpoint (if any) and starts its job.
func (t *task) start() (*pipeline.Job, uint64, error) {
	w := t.w
	u, err := PartitionURL(w.base, w.o.Spec.Name, t.p)
	if err != nil {
		return nil, 0, err
	}
	spec, err := taskSpec(w.o.Spec, t.p, u)
	if err != nil {
		return nil, 0, err
	}
	// The task's Kafka sink commits its partition's offsets to the group inside each
	// checkpoint's transaction (the source's group option names it).
	if spec.Sources[0].Options == nil {
		spec.Sources[0].Options = map[string]any{}
	}
	spec.Sources[0].Options["group"] = w.o.Group
	conns := w.o.NewConnectors()
	f := conns.SourceFactoryOf("kafka")
	if f == nil {
		return nil, 0, errors.New("cluster: no kafka source connector is registered")
	}
	split := fmt.Sprintf("%s/%d", w.topic, t.p)
	conns.RegisterSource("kafka", func(s *pipeline.SourceSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Source, error) {
		src, err := f(s, o, env)
		if err != nil {
			return nil, err
		}
		return &ownedSource{Source: src, split: split}, nil
	})
	env := w.o.Env
	env.Connectors, env.StateURL, env.Store, env.Restore = conns, u, nil, "latest-if-any"
	env.Log = w.log.With("partition", t.p)
	job, err := pipeline.Start(t.ctx, spec, env)
	if err != nil {
		return nil, 0, fmt.Errorf("partition %d: %w", t.p, err)
	}
	// Start returns before the attempt restores: wait until it runs (its sinks recovered,
	// fencing the previous owner's transactions; its state's lineage head claimed; its
	// sources open), or ends. The job has no event for it, so poll its state, briefly.
	for {
		m := job.Metrics()
		if m.State == pipeline.JobRunning {
			return job, m.Restored, nil
		}
		select {
		case <-job.Done():
			return job, m.Restored, nil // the caller sees it ended
		case <-t.ctx.Done():
			return job, m.Restored, nil // the caller stops it
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// ownedSource is a source restricted to the one split (partition) its task owns.
type ownedSource struct {
	pipeline.Source
	split string
}

func (s *ownedSource) Splits(ctx context.Context) ([]string, error) {
	all, err := s.Source.Splits(ctx)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(all, s.split) {
		return nil, fmt.Errorf("cluster: the source has no split %q (it has %d splits)", s.split, len(all))
	}
	return []string{s.split}, nil
}
