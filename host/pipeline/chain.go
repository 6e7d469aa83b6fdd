package pipeline

import (
	"context"
	"fmt"
	"sync/atomic"
)

// # Chained sinks
//
// A sink whose one input is an operator's main output, at the operator's parallelism, is
// chained to it, as Flink chains a forward edge by default: sink subtask i runs inside operator
// subtask i's goroutine, which hands it its records directly. There is no channel, no input
// merger and no sink goroutine in between, so a record costs one copy fewer and two goroutine
// hand-overs fewer; everything else is as for a sink subtask of its own:
//
//   - records reach SinkWriter.Write in batches of up to batchRecords, in the order the
//     operator subtask emitted them (so each key's records keep their order, as on a hashed
//     edge: an operator's key is owned by one subtask);
//   - on barrier n, after the records before it, the chained sink pre-commits and acknowledges
//     as a sink subtask does, then the operator forwards the barrier on its other outputs;
//     the coordinator's two-phase commit is unchanged;
//   - a slow sink blocks the operator's runner, whose inputs fill up: backpressure reaches the
//     sources as through a full channel (and the stuck-channel log names the channel into the
//     operator, the last one on the way).
//
// Which subtask a record reaches differs from a hashed edge only for a record whose emitted
// key belongs to another subtask's key groups (an operator that re-keys its output): it stays
// in its producer's sink subtask, where a hashed edge would move it. Docs/pipeline-spec.md
// says so.
//
// INVARIANT: a chainedSink is used by its operator subtask's runner only (the late side output,
// the one edge with a second sender, is never chained).

// chainable reports whether sink sk is chained to its input (see above).
func (a *attempt) chainable(sk *SinkSpec) bool {
	if len(sk.Inputs) != 1 {
		return false
	}
	op := a.spec.Operator(sk.Inputs[0]) // nil for a source or a side output ("op.late")
	return op != nil && op.Parallelism == sk.Parallelism
}

// chainedSink is one sink subtask chained to an operator subtask.
type chainedSink struct {
	a       *attempt
	name    string
	subtask int
	w       SinkWriter // set once the sink subtask is opened
	recs    []SinkRecord
	arena   []byte
	closed  bool
	records atomic.Int64
	// err is the sink's first failure. It fails the job as the sink's own, as a sink subtask's
	// would, not as the operator call whose output it was writing.
	err error
}

func (s *chainedSink) wrap(err error) error {
	if s.err == nil {
		s.err = fmt.Errorf("sink %s[%d]: %w", s.name, s.subtask, err)
	}
	return s.err
}

// add buffers a record, copying its bytes into the sink's arena (what the operator emits may
// live only until its call returns). The arena is reused once the records in it are written,
// since a SinkWriter keeps nothing of what it is given.
func (s *chainedSink) add(ctx context.Context, key, value []byte, ts, pos int64) error {
	n := len(key) + len(value)
	if n > cap(s.arena)-len(s.arena) {
		// The buffered records keep the old arena until they are written.
		s.arena = make([]byte, 0, max(2*cap(s.arena), 16<<10, n))
	}
	at := len(s.arena)
	s.arena = append(append(s.arena, key...), value...)
	kv := s.arena[at:len(s.arena):len(s.arena)]
	s.recs = append(s.recs, SinkRecord{Key: kv[:len(key):len(key)], Value: kv[len(key):], TS: ts, Pos: pos})
	if len(s.recs) >= batchRecords {
		return s.flush(ctx)
	}
	return nil
}

// flush writes the buffered records.
func (s *chainedSink) flush(ctx context.Context) error {
	if len(s.recs) == 0 {
		return nil
	}
	err := s.w.Write(ctx, s.recs)
	s.records.Add(int64(len(s.recs)))
	s.recs = s.recs[:0]
	s.arena = s.arena[:0]
	if err != nil {
		return s.wrap(err)
	}
	return nil
}

// barrier pre-commits checkpoint id after the records before it, and acknowledges it.
func (s *chainedSink) barrier(ctx context.Context, id uint64) error {
	if err := s.flush(ctx); err != nil {
		return err
	}
	h, err := s.w.PreCommit(ctx, id)
	if err != nil {
		return s.wrap(fmt.Errorf("pre-committing checkpoint %d: %w", id, err))
	}
	s.a.coord.send(ctx, ack{kind: ackSink, node: s.name, subtask: s.subtask, id: id, handle: h})
	return nil
}

// close ends the sink subtask at the end of its input: it writes what is buffered and closes
// the writer.
func (s *chainedSink) close(ctx context.Context) error {
	if s.closed || s.w == nil {
		return nil
	}
	s.closed = true
	err := s.flush(ctx)
	if cerr := s.w.Close(ctx); cerr != nil && err == nil {
		err = s.wrap(cerr)
	}
	return err
}

// abandon closes the writer of a subtask that did not reach the end of its input (a failure,
// a cancellation): what it wrote since the last pre-commit is abandoned, as a sink subtask's.
func (s *chainedSink) abandon(ctx context.Context) {
	if s.closed || s.w == nil {
		return
	}
	s.closed = true
	s.w.Close(context.WithoutCancel(ctx))
}
