package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// PendingEpoch is the part of a pending manifest (uploaded in step 1 of an epoch, with the
// state delta, before any transaction commits) that recovery needs.
type PendingEpoch struct {
	Epoch    uint64
	Manifest string
	Prepared []Prepared // one per sink subtask
}

// RecoverInput is what the pipeline knows after a crash: the last committed manifest and,
// if its store has one, the pending manifest of the next epoch.
type RecoverInput struct {
	Sink     SinkConfig
	Job      string
	SinkName string
	// Parallelism is the sink parallelism of the run that crashed (from the manifests).
	Parallelism int
	// LastCommitted is the epoch of the last committed manifest, 0 if none.
	LastCommitted uint64
	// Pending is the pending manifest of epoch LastCommitted+1, nil if the store has none.
	Pending *PendingEpoch
}

// Decision is what the pipeline does next.
type Decision struct {
	// RollForward: epoch Epoch's transactions are committed (some were, and recovery
	// committed the rest), so the pipeline commits the pending manifest of Epoch and
	// restores from it. Otherwise it restores from Epoch = LastCommitted: every
	// transaction after it has been aborted.
	RollForward bool
	Epoch       uint64
	// Manifest is the pending manifest's name, as the committed markers carry it.
	Manifest string
	// Resumed lists the subtasks whose pre-committed transaction recovery committed.
	Resumed []int
}

// Recover brings the sink's transactions of a crashed run to a state that agrees with one
// manifest, and says which. It must run before the new run creates its sinks, while the
// crashed run's sinks are stopped (dead, or closed in process). The rule, with
// n = LastCommitted+1:
//
//   - no subtask's marker for n is committed: fence every transactional ID of the sink
//     (which aborts any open transaction) and restore from LastCommitted;
//   - some subtask's marker for n is committed: commit the others' pre-committed
//     transactions of n from Pending (EndTxn with the producer ID and epoch they recorded),
//     fence every transactional ID, and roll forward to n;
//   - a marker of n committed while some subtask's transaction of n can no longer be
//     committed: ErrPartialCommit; a marker newer than n, or of n without a pending
//     manifest: ErrInvariant.
//
// After fencing, the markers are read again and the decision is made on what is then
// committed, so a transaction that committed while recovery ran is not missed.
func Recover(ctx context.Context, in RecoverInput) (Decision, error) {
	d := Decision{Epoch: in.LastCommitted}
	if err := in.Sink.Validate(); err != nil {
		return d, err
	}
	if !in.Sink.exactlyOnce() {
		// At least once: nothing to resolve; outputs since LastCommitted will be written again.
		return d, nil
	}
	if in.Parallelism < 1 {
		return d, configErr("parallelism", "the crashed run's sink parallelism is required")
	}
	n := in.LastCommitted + 1
	if in.Pending != nil && in.Pending.Epoch != n {
		return d, &Error{Op: "recover", Kind: ErrInvariant, Err: fmt.Errorf("pending manifest of epoch %d, but the last committed is %d", in.Pending.Epoch, in.LastCommitted)}
	}
	admin, err := in.Sink.newClient()
	if err != nil {
		return d, err
	}
	defer admin.Close()
	ids := make([]Identity, in.Parallelism)
	for i := range ids {
		ids[i] = Identity{Job: in.Job, Sink: in.SinkName, Subtask: i, Parallelism: in.Parallelism}
		if err := ids[i].validate(); err != nil {
			return d, err
		}
	}
	topic := in.Sink.markerTopic(ids[0])
	if _, err := describe(ctx, admin, in.Sink.Config, []string{topic}); err != nil && !errors.Is(err, ErrMissingTopic) {
		return d, err
	} else if err != nil {
		topic = "" // never written: no marker anywhere
	}
	read := func() ([]markerValue, []bool, error) {
		ms, found := make([]markerValue, len(ids)), make([]bool, len(ids))
		if topic == "" {
			return ms, found, nil
		}
		for i, id := range ids {
			m, ok, err := lastMarker(ctx, admin, in.Sink.Config, topic, id)
			if err != nil {
				return nil, nil, err
			}
			if ok && m.Epoch > n {
				return nil, nil, &Error{Op: "recover", Kind: ErrInvariant, Err: fmt.Errorf(
					"subtask %d committed epoch %d, after the last committed manifest %d and its successor", i, m.Epoch, in.LastCommitted)}
			}
			if ok && m.Epoch == n && in.Pending == nil {
				return nil, nil, &Error{Op: "recover", Kind: ErrInvariant, Err: fmt.Errorf(
					"subtask %d committed epoch %d (manifest %q), but the store has no pending manifest of it", i, n, m.Manifest)}
			}
			ms[i], found[i] = m, ok
		}
		return ms, found, nil
	}
	atN := func(ms []markerValue, found []bool) (any bool, missing []int) {
		for i := range ms {
			if found[i] && ms[i].Epoch == n {
				any = true
			} else {
				missing = append(missing, i)
			}
		}
		return any, missing
	}

	ms, found, err := read()
	if err != nil {
		return d, err
	}
	resumeErrs := map[int]error{}
	if any, missing := atN(ms, found); any {
		for _, p := range in.Pending.Prepared {
			if slices.Contains(missing, p.Subtask) {
				if err := resumeCommit(ctx, admin, in.Sink.Config, p); err != nil {
					resumeErrs[p.Subtask] = err
				} else {
					d.Resumed = append(d.Resumed, p.Subtask)
				}
			}
		}
	}
	for _, id := range ids {
		for slot := range 2 {
			if err := fence(ctx, admin, in.Sink, id.TransactionalID(slot)); err != nil {
				return d, err
			}
		}
	}
	if ms, found, err = read(); err != nil {
		return d, err
	}
	any, missing := atN(ms, found)
	if !any {
		return d, nil
	}
	if len(missing) > 0 {
		var errs []error
		for _, i := range missing {
			errs = append(errs, fmt.Errorf("subtask %d: last committed epoch %d: %w", i, ms[i].Epoch, resumeErrs[i]))
		}
		return d, &Error{Op: "recover", Kind: ErrPartialCommit, Err: fmt.Errorf("epoch %d: %w", n, errors.Join(errs...))}
	}
	d.RollForward, d.Epoch, d.Manifest = true, n, ms[0].Manifest
	return d, nil
}

// resumeCommit commits a pre-committed transaction from another process: EndTxn(commit)
// with the producer ID and epoch its producer had (the same move as Flink's
// resumeTransaction, done with the protocol's own request).
func resumeCommit(ctx context.Context, admin *kgo.Client, c Config, p Prepared) error {
	if p.TransactionalID == "" {
		return fmt.Errorf("subtask %d: no transaction was prepared", p.Subtask)
	}
	req := kmsg.NewPtrEndTxnRequest()
	req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Commit = p.TransactionalID, p.ProducerID, p.ProducerEpoch, true
	return retryRequest(ctx, c, "resume commit "+p.TransactionalID, func(ctx context.Context) (int16, error) {
		resp, err := req.RequestWith(ctx, admin)
		if err != nil {
			return 0, err
		}
		return resp.ErrorCode, nil
	})
}

// fence bumps txnID's producer epoch with InitProducerID, which aborts its open
// transaction, if any, and makes any older incarnation's requests fail.
func fence(ctx context.Context, admin *kgo.Client, sc SinkConfig, txnID string) error {
	req := kmsg.NewPtrInitProducerIDRequest()
	req.TransactionalID = &txnID
	req.TransactionTimeoutMillis = int32(sc.txnTimeout().Milliseconds())
	req.ProducerID, req.ProducerEpoch = -1, -1
	return retryRequest(ctx, sc.Config, "fence "+txnID, func(ctx context.Context) (int16, error) {
		resp, err := req.RequestWith(ctx, admin)
		if err != nil {
			return 0, err
		}
		return resp.ErrorCode, nil
	})
}

// retryRequest runs a raw request until it is answered without a retryable error
// (CONCURRENT_TRANSACTIONS while the coordinator completes an earlier commit or abort,
// COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR, ...) or a transport error (the broker is
// away), within the request timeout. franz-go retries its own requests; a raw request
// issued with RequestWith fails at the first dial error, so without this a broker that is
// away for a moment would fail a pre-commit that the producer itself rides out. Every
// request issued through here is safe to repeat.
func retryRequest(ctx context.Context, c Config, op string, do func(context.Context) (int16, error)) error {
	ctx, cancel := context.WithTimeout(ctx, c.requestTimeout())
	defer cancel()
	for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		code, err := do(ctx)
		if err == nil {
			err = kerr.ErrorForCode(code)
		}
		if err == nil {
			return nil
		}
		_, isKafka := errors.AsType[*kerr.Error](err)
		retry := kerr.IsRetriable(err) || (!isKafka && !errors.Is(err, kgo.ErrClientClosed))
		if !retry || ctx.Err() != nil {
			return brokersErr(c, classify(op, err))
		}
		select {
		case <-ctx.Done():
			return brokersErr(c, classify(op, err))
		case <-time.After(backoff):
		}
	}
}
