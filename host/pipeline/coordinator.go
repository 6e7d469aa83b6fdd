package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// # The checkpoint coordinator
//
// One coordinator per job attempt drives checkpoints as a two-phase commit (docs/DESIGN.md,
// "Pipelines and checkpoints"):
//
//  1. trigger n: every source subtask records its split positions, acknowledges them, and
//     sends barrier n downstream after the records it read before;
//  2. every operator subtask aligns barrier n across its inputs, drains (scheduler barrier
//     drain), captures its state on the runner and forwards the barrier; the capture is
//     persisted off the runner and acknowledged once durable;
//  3. every sink subtask aligns barrier n, pre-commits, and acknowledges with its handle;
//  4. with every acknowledgement in, the coordinator prepares each sink's part, commits ONE
//     checkpoint record (create-once) naming positions, state checkpoints and sink handles,
//     and only then commits the sinks (idempotently).
//
// Deciding sinks (a Kafka transaction) change step 4: the record is written as prepared, the
// sink commits its transaction with a marker naming the record, then the record is
// committed. One checkpoint is in flight at a time.

type trigger struct {
	id               uint64
	savepoint, final bool
}

type ackKind uint8

const (
	ackSource ackKind = iota
	ackOperator
	ackSink
	ackEOF // a source subtask reached the end of its splits
)

type ack struct {
	kind    ackKind
	node    string
	subtask int
	id      uint64
	splits  []Split
	handle  []byte
	bytes   int64
	err     error
}

type pendingCheckpoint struct {
	trigger
	started  time.Time
	sources  map[string][][]Split // by subtask
	handles  map[string][][]byte
	opBytes  map[string]int64
	got      int
	want     int
	replies  []chan savepointReply
	deadline *time.Timer
}

type savepointReply struct {
	id  uint64
	err error
}

type request struct {
	savepoint bool
	stop      bool
	reply     chan savepointReply
}

// CheckpointInfo describes a committed checkpoint (metrics and summaries).
type CheckpointInfo struct {
	ID         uint64
	Savepoint  bool
	Final      bool
	Duration   time.Duration
	StateBytes int64
	// Positions are the source positions the checkpoint covers, by source.
	Positions map[string][]Split
}

// CommitPhase names the points of a checkpoint commit, for fault-injection hooks.
type CommitPhase string

const (
	PhaseAcknowledged  CommitPhase = "acknowledged"   // state durable, sinks pre-committed
	PhasePrepared      CommitPhase = "prepared"       // prepared record written (deciding sinks)
	PhaseDecided       CommitPhase = "decided"        // deciding sinks committed
	PhaseRecordWritten CommitPhase = "record-written" // the checkpoint record is durable
	PhaseSinkCommitted CommitPhase = "sink-committed" // one sink committed
)

type coordinator struct {
	a        *attempt
	log      *slog.Logger
	triggers map[string][]chan trigger
	acks     chan ack
	requests chan request
	seq      uint64
	eofs     int
	nSources int
	nOps     int
	nSinks   int
	interval time.Duration
	timeout  time.Duration

	mu        sync.Mutex
	infos     map[uint64]trigger // id -> trigger, for subtasks' OnBarrier
	completed []CheckpointInfo
	last      *CheckpointInfo
}

func (c *coordinator) info(id uint64) trigger {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.infos[id]
}

// send delivers an acknowledgement; the coordinator always takes them until the attempt ends.
func (c *coordinator) send(ctx context.Context, a ack) {
	select {
	case c.acks <- a:
	case <-ctx.Done():
	}
}

// run drives checkpoints until the final one is committed (nil), or a failure.
func (c *coordinator) run(ctx context.Context) error {
	var tick <-chan time.Time
	if c.interval > 0 {
		t := time.NewTicker(c.interval)
		defer t.Stop()
		tick = t.C
	}
	var (
		pending     *pendingCheckpoint
		queued      []request // savepoint requests waiting for the checkpoint in flight
		final       *request  // a stop with or without savepoint, or the end of a bounded input
		finalWanted bool
		timeoutC    <-chan time.Time
	)
	fail := func(err error, p *pendingCheckpoint) error {
		if p != nil {
			for _, r := range p.replies {
				r <- savepointReply{err: err}
			}
		}
		for _, r := range queued {
			r.reply <- savepointReply{err: err}
		}
		if final != nil && final.reply != nil {
			final.reply <- savepointReply{err: err}
		}
		return err
	}
	start := func(t trigger, replies []chan savepointReply) error {
		c.seq++
		t.id = c.a.attemptNo*attemptStride + c.seq
		c.mu.Lock()
		c.infos[t.id] = t
		c.mu.Unlock()
		pending = &pendingCheckpoint{trigger: t, started: time.Now(), sources: map[string][][]Split{},
			handles: map[string][][]byte{}, opBytes: map[string]int64{}, want: c.nSources + c.nOps + c.nSinks, replies: replies}
		pending.deadline = time.NewTimer(c.timeout)
		timeoutC = pending.deadline.C
		for _, chans := range c.triggers {
			for _, ch := range chans {
				select {
				case ch <- t:
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			}
		}
		return nil
	}
	maybeStart := func() error {
		if pending != nil {
			return nil
		}
		if len(queued) > 0 {
			var replies []chan savepointReply
			for _, r := range queued {
				replies = append(replies, r.reply)
			}
			queued = nil
			return start(trigger{savepoint: true}, replies)
		}
		if finalWanted {
			finalWanted = false
			t := trigger{final: true, savepoint: final.savepoint}
			var replies []chan savepointReply
			if final.reply != nil {
				replies = append(replies, final.reply)
				final.reply = nil
			}
			return start(t, replies)
		}
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return fail(context.Cause(ctx), pending)
		case <-tick:
			if pending == nil && final == nil {
				if err := start(trigger{}, nil); err != nil {
					return fail(err, pending)
				}
			}
		case <-timeoutC:
			return fail(fmt.Errorf("checkpoint %d did not complete within %s", pending.id, c.timeout), pending)
		case r := <-c.requests:
			switch {
			case final != nil:
				r.reply <- savepointReply{err: ErrJobFinishing}
			case r.stop:
				final, finalWanted = &r, true
			default:
				queued = append(queued, r)
			}
			if err := maybeStart(); err != nil {
				return fail(err, pending)
			}
		case a := <-c.acks:
			if a.err != nil {
				return fail(a.err, pending)
			}
			if a.kind == ackEOF {
				c.eofs++
				// In streaming mode a job whose sources all ended keeps running (and taking
				// checkpoints) until it is stopped.
				if c.eofs == c.nSources && final == nil && c.a.spec.Mode != ModeStreaming {
					final = &request{savepoint: *c.a.spec.Checkpoints.FinalSavepoint}
					finalWanted = true
				}
				if err := maybeStart(); err != nil {
					return fail(err, pending)
				}
				continue
			}
			if pending == nil || a.id != pending.id {
				return fail(fmt.Errorf("acknowledgement of checkpoint %d from %s[%d] while %v is in flight", a.id, a.node, a.subtask, pending), pending)
			}
			switch a.kind {
			case ackSource:
				s := pending.sources[a.node]
				if s == nil {
					s = make([][]Split, c.a.sourceSpec(a.node).Parallelism)
					pending.sources[a.node] = s
				}
				s[a.subtask] = a.splits
			case ackOperator:
				pending.opBytes[a.node] += a.bytes
			case ackSink:
				h := pending.handles[a.node]
				if h == nil {
					h = make([][]byte, c.a.sinkSpec(a.node).Parallelism)
					pending.handles[a.node] = h
				}
				h[a.subtask] = a.handle
			}
			pending.got++
			if pending.got < pending.want {
				continue
			}
			pending.deadline.Stop()
			timeoutC = nil
			p := pending
			pending = nil
			info, err := c.commit(ctx, p)
			if err != nil {
				return fail(fmt.Errorf("checkpoint %d: %w", p.id, err), p)
			}
			for _, r := range p.replies {
				r <- savepointReply{id: p.id}
			}
			if p.final {
				c.log.Info("final checkpoint committed", "checkpoint", info.ID, "savepoint", info.Savepoint)
				return nil
			}
			if err := maybeStart(); err != nil {
				return fail(err, pending)
			}
		}
	}
}

// ErrJobFinishing refuses a savepoint or stop once the job is taking its final checkpoint.
var ErrJobFinishing = errors.New("the job is already finishing")

// commit writes the checkpoint record and commits the sinks.
func (c *coordinator) commit(ctx context.Context, p *pendingCheckpoint) (CheckpointInfo, error) {
	a := c.a
	hook := a.env.OnCommitPhase
	phase := func(ph CommitPhase) error {
		if hook != nil {
			if err := hook(ph, p.id); err != nil {
				return fmt.Errorf("at %s: %w", ph, err)
			}
		}
		return nil
	}
	if err := phase(PhaseAcknowledged); err != nil {
		return CheckpointInfo{}, err
	}
	rec := &CheckpointRecord{
		Format: RecordFormat, Job: a.spec.Name, Tenant: a.spec.Tenant, ID: p.id, Attempt: a.attemptNo,
		Savepoint: p.savepoint, Final: p.final, Created: time.Now().UTC(), KeyGroups: a.spec.KeyGroups,
		SpecSHA256: a.specSHA, Sources: map[string]*SourceCheckpoint{}, Operators: map[string]*OperatorCheckpoint{},
		Sinks: map[string]*SinkCheckpoint{},
	}
	info := CheckpointInfo{ID: p.id, Savepoint: p.savepoint, Final: p.final, Positions: map[string][]Split{}}
	for _, s := range a.spec.Sources {
		var all []Split
		for _, sub := range p.sources[s.Name] {
			all = append(all, sub...)
		}
		slices.SortFunc(all, func(x, y Split) int {
			if x.ID < y.ID {
				return -1
			} else if x.ID > y.ID {
				return 1
			}
			return 0
		})
		rec.Sources[s.Name] = &SourceCheckpoint{Parallelism: s.Parallelism, Splits: all}
		info.Positions[s.Name] = all
	}
	for _, op := range a.ops {
		oc := &OperatorCheckpoint{ModuleSHA256: op.sha, Module: op.mod.Name(), States: op.mod.Manifest.States, StateVersion: op.mod.Manifest.StateVersion,
			Parallelism: op.spec.Parallelism, StateName: op.stateName, StateCheckpoint: p.id, Bytes: p.opBytes[op.spec.Name]}
		for i := range op.spec.Parallelism {
			r := op.ranges[i]
			oc.KeyGroupRanges = append(oc.KeyGroupRanges, [2]int{r.Lo, r.Hi})
		}
		rec.Operators[op.spec.Name] = oc
		info.StateBytes += oc.Bytes
	}
	var deciding []string
	for _, sk := range a.spec.Sinks {
		sc := &SinkCheckpoint{Parallelism: sk.Parallelism}
		if cm := a.sinks[sk.Name].Committer(); cm != nil {
			prep, err := cm.Prepare(ctx, p.id, p.handles[sk.Name])
			if err != nil {
				return info, fmt.Errorf("preparing sink %s: %w", sk.Name, err)
			}
			sc.Prepared = prep
			if _, ok := cm.(DecidingSink); ok {
				deciding = append(deciding, sk.Name)
			}
		}
		rec.Sinks[sk.Name] = sc
	}
	if len(deciding) > 0 {
		if err := a.records.Put(ctx, kindPrepared, rec); err != nil {
			return info, fmt.Errorf("writing the prepared record: %w", err)
		}
		if err := phase(PhasePrepared); err != nil {
			return info, err
		}
		for _, name := range deciding {
			d := a.sinks[name].Committer().(DecidingSink)
			if err := d.Decide(ctx, p.id, recordName(p.id), rec.Sinks[name].Prepared); err != nil {
				return info, fmt.Errorf("sink %s: %w", name, err)
			}
		}
		if err := phase(PhaseDecided); err != nil {
			return info, err
		}
	}
	if err := a.records.Put(ctx, kindCommitted, rec); err != nil {
		return info, fmt.Errorf("committing the checkpoint record: %w", err)
	}
	if err := phase(PhaseRecordWritten); err != nil {
		return info, err
	}
	for _, sk := range a.spec.Sinks {
		if cm := a.sinks[sk.Name].Committer(); cm != nil {
			if err := cm.Commit(ctx, p.id, rec.Sinks[sk.Name].Prepared); err != nil {
				return info, fmt.Errorf("committing sink %s: %w", sk.Name, err)
			}
			if err := phase(PhaseSinkCommitted); err != nil {
				return info, err
			}
		}
	}
	if len(deciding) > 0 {
		_ = a.records.Delete(ctx, kindPrepared, p.id)
	}
	info.Duration = time.Since(p.started)
	c.retain(ctx)
	c.mu.Lock()
	c.completed = append(c.completed, info)
	if len(c.completed) > 64 {
		c.completed = c.completed[1:]
	}
	c.last = &info
	delete(c.infos, p.id)
	c.mu.Unlock()
	a.job.noteCheckpoint(info)
	c.log.Debug("checkpoint committed", "checkpoint", p.id, "took", info.Duration)
	return info, nil
}

// retain deletes committed records beyond the newest Retain, savepoints excepted. Deleting a
// record only makes the checkpoint unrestorable; the state tier collects its data on its own
// schedule.
func (c *coordinator) retain(ctx context.Context) {
	ids, err := c.a.records.List(ctx, kindCommitted)
	if err != nil {
		c.log.Warn("listing checkpoint records", "err", err)
		return
	}
	keep := c.a.spec.Checkpoints.Retain
	var regular []uint64
	for i := len(ids) - 1; i >= 0; i-- {
		r, err := c.a.records.Get(ctx, kindCommitted, ids[i])
		if err != nil || r.Savepoint {
			continue
		}
		regular = append(regular, ids[i])
	}
	for _, id := range regular[min(keep, len(regular)):] {
		if err := c.a.records.Delete(ctx, kindCommitted, id); err != nil {
			c.log.Warn("deleting an old checkpoint record", "checkpoint", id, "err", err)
		}
	}
}
