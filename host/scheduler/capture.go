package scheduler

// # Barrier capture
//
// With WithBarrierCapture, a checkpoint barrier does not wait for every admitted record. It
// waits only for the calls in progress (running or suspended: they hold an instance) and for
// the epochs closed before it to be released; the records admitted but whose call has not
// started (parked behind a busy key, waiting for room under the cap, waiting for their
// prefetched values or for an instance) are captured into the checkpoint as its input, as
// Flink's unaligned checkpoints capture channel state. The live run then goes on with them
// after the barrier; a run restored from the checkpoint replays them first, before any new
// input, each key's in its arrival order.
//
// Why it is a consistent cut:
//   - While the barrier waits, no record of the open epoch starts its call (execute freezes it
//     at the point where the call would start; its key stays busy). So the state captured
//     reflects exactly the calls that completed before the barrier, their outputs precede the
//     barrier's mark in the output, and no captured record has touched state or emitted.
//   - Per-key order: a key's records are admitted in arrival order and run one at a time. A
//     key with a call in progress and more records parked behind it finishes that call before
//     the capture; the parked ones are captured, after it in the key's order (the gate entry's
//     task, then its queue), and replayed in that order they run as they would have.
//   - Epochs: records of epochs closed before the barrier (a watermark, or processing-time
//     timers, closed them) are not frozen: they run, their epochs are released (timers fire,
//     the watermark is forwarded) before the capture, as without capture. Only once a single
//     open epoch is left does freezing start, and nothing closes it before the barrier
//     completes (no input is taken, processing-time timers wait for the barrier). So captured
//     records are all of the open epoch, and the watermark they saw is the last one received:
//     the blob records it, and a restored controller starts from it.
//   - Timers are never captured: none is pending once the closed epochs are released.
//   - Lookups: a record waiting for one is in its call, so the barrier waits for it. A
//     captured record makes its lookups after the restore with the same idempotency keys.
//
// What the capture holds is bounded by admission (mayAdmit): at most the in-flight cap's tasks
// counting against it, plus the records waiting (parked, or for room under the cap) within
// WithWaitingMemory's bytes.
//
// The blob is the backend operator state "clink.input" (so it rides in the checkpoint's
// manifest, as the timers do):
//
//	version byte (1) | varint watermark | uvarint count
//	count × { uvarint len(key) | key | uvarint len(value) | value | varint ts | varint pos }
//
// No blob, or an empty one (a checkpoint written without capture), replays nothing.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/clink-wasm/clink-wasm/host/state"
)

func stateKey(id uint32, record []byte) state.Key {
	return state.Key{State: state.StateID(id), Record: record}
}

// InputStateName is the operator-state blob in which a barrier's captured input is kept.
const InputStateName = "clink.input"

// WithBarrierCapture makes the barriers for which at(id) is true capture the records admitted
// but not started instead of waiting for them (see capture.go): such a barrier waits only for
// the calls in progress. The records are stored in the backend's operator state
// InputStateName before OnBarrier runs, and a controller created over a backend that holds
// such a blob replays them first. A final barrier (the run ends after it, with no later
// checkpoint to cover what the captured records output) must not capture: at decides. Only
// for OrderPerKey; other orders drain as before. Default (nil): every barrier drains every
// admitted record.
func WithBarrierCapture(at func(id uint64) bool) Option {
	return optionFunc(func(c *config) { c.BarrierCapture = at })
}

// CaptureAll is a WithBarrierCapture predicate for controllers whose every barrier may
// capture (a run that ends with its input, not with a barrier).
func CaptureAll(uint64) bool { return true }

// ErrCapturedInput reports a captured-input blob that cannot be read.
var ErrCapturedInput = errors.New("scheduler: unreadable captured input")

// CapturedInput is a barrier's captured input: the records, each key's in its arrival order,
// and the watermark they saw.
type CapturedInput struct {
	Watermark int64
	Records   []Element
}

// EncodeCapturedInput encodes in as the InputStateName blob.
func EncodeCapturedInput(in CapturedInput) []byte {
	n := 1 + 2*binary.MaxVarintLen64
	for i := range in.Records {
		n += len(in.Records[i].Key) + len(in.Records[i].Value) + 4*binary.MaxVarintLen64
	}
	b := make([]byte, 0, n)
	b = append(b, 1)
	b = binary.AppendVarint(b, in.Watermark)
	b = binary.AppendUvarint(b, uint64(len(in.Records)))
	for i := range in.Records {
		b = appendCaptured(b, in.Records[i].Key, in.Records[i].Value, in.Records[i].TS, in.Records[i].Pos)
	}
	return b
}

func appendCaptured(b, key, value []byte, ts, pos int64) []byte {
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	b = binary.AppendUvarint(b, uint64(len(value)))
	b = append(b, value...)
	b = binary.AppendVarint(b, ts)
	return binary.AppendVarint(b, pos)
}

// DecodeCapturedInput reads an InputStateName blob. An empty blob is no input. The records'
// keys and values alias b.
func DecodeCapturedInput(b []byte) (CapturedInput, error) {
	in := CapturedInput{Watermark: math.MinInt64}
	if len(b) == 0 {
		return in, nil
	}
	if b[0] != 1 {
		return in, fmt.Errorf("%w: version %d (this host reads 1)", ErrCapturedInput, b[0])
	}
	b = b[1:]
	wm, k := binary.Varint(b)
	if k <= 0 {
		return in, fmt.Errorf("%w: truncated watermark", ErrCapturedInput)
	}
	b = b[k:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) { // each record takes at least 4 bytes
		return in, fmt.Errorf("%w: bad record count", ErrCapturedInput)
	}
	b = b[k:]
	in.Watermark = wm
	in.Records = make([]Element, 0, n)
	field := func() ([]byte, bool) {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return nil, false
		}
		f := b[k : k+int(l) : k+int(l)]
		b = b[k+int(l):]
		return f, true
	}
	for i := range n {
		key, ok1 := field()
		value, ok2 := field()
		if !ok1 || !ok2 {
			return in, fmt.Errorf("%w: record %d truncated", ErrCapturedInput, i)
		}
		ts, k1 := binary.Varint(b)
		if k1 <= 0 {
			return in, fmt.Errorf("%w: record %d truncated", ErrCapturedInput, i)
		}
		b = b[k1:]
		pos, k2 := binary.Varint(b)
		if k2 <= 0 {
			return in, fmt.Errorf("%w: record %d truncated", ErrCapturedInput, i)
		}
		b = b[k2:]
		in.Records = append(in.Records, Element{Kind: ElementRecord, Key: key, Value: value, TS: ts, Pos: pos})
	}
	if len(b) != 0 {
		return in, fmt.Errorf("%w: %d trailing bytes", ErrCapturedInput, len(b))
	}
	return in, nil
}

// restoreInput reads the backend's captured input, if any, to be replayed before the input
// channel (Run), and starts from the watermark it records.
func (c *Controller) restoreInput() error {
	blob := c.cfg.Backend.OperatorState(InputStateName)
	if blob == nil {
		return nil
	}
	c.inputSet = true // the next barrier replaces it, even with nothing captured
	in, err := DecodeCapturedInput(blob)
	if err != nil {
		return fmt.Errorf("operator %q: restoring its captured input: %w", c.name, err)
	}
	if in.Watermark != math.MinInt64 {
		c.lastWM, c.watermark = in.Watermark, in.Watermark
		c.epochs[0].startWM = in.Watermark
	}
	c.replay = in.Records
	c.metrics.ReplayedRecords.Store(int64(len(in.Records)))
	return nil
}

// capturing reports whether barriers capture input in this run.
func (c *Controller) capturing() bool {
	return c.cfg.BarrierCapture != nil && c.cfg.Order == OrderPerKey && !c.cfg.Synchronous
}

// freezing reports whether, a barrier pending, a record about to start its call waits for the
// barrier to be captured instead: only once every earlier epoch has been released (see the
// file comment), and not after a capture fell back to a drain.
func (c *Controller) freezing() bool {
	return c.captureThis && len(c.epochs) == 1 && !c.drainOnly
}

// freeze holds t back from starting its call until the barrier has been captured. Its key
// stays busy; its prefetched values are held hot, and checked again when it runs.
func (c *Controller) freeze(t *task) {
	if c.pfTask == t {
		c.pfTask = nil // the stashed answers are valid only until the backend is used again
	}
	if t.prefetched {
		for _, id := range c.prefetch {
			c.hold(t, stateKey(id, t.key))
		}
		t.prefetched = false
	}
	t.knownCold, t.async = false, true
	c.markKeyBusy(t)
	c.frozen = append(c.frozen, t)
}

// barrierDrained reports whether the pending barrier can be completed: every admitted task
// has finished, or (capturing) no call is in progress and every earlier epoch is released,
// so what is left is captured.
func (c *Controller) barrierDrained() bool {
	if len(c.epochs) != 1 || len(c.batch.tasks) > 0 {
		return false
	}
	if c.admitted == 0 {
		return true
	}
	return c.freezing() && c.running == 0 && c.ready.len() == 0 && len(c.suspended) == 0
}

// captureInput stores the records admitted and not started in the backend's operator state,
// as the barrier's captured input. It reports false when a task is not where the capture
// looks (a bug): then the barrier drains every admitted task instead, as without capture.
func (c *Controller) captureInput(id uint64) bool {
	if !c.captureThis {
		// A barrier that drains (a final one, or an order other than per key): every admitted
		// record has run, the restored input with them, so none is left.
		if c.inputSet {
			c.cfg.Backend.SetOperatorState(InputStateName, nil)
			c.inputSet = false
		}
		return true
	}
	from := time.Now()
	defer func() { c.metrics.CaptureInputNanos.Add(int64(time.Since(from))) }()
	var tasks []*task
	ok := true
	if c.admitted > 0 {
		tasks = make([]*task, 0, c.admitted)
		for i := range c.gate.slots {
			g := c.gate.slots[i].g
			if g == nil {
				continue
			}
			if t := g.owner; t != nil {
				tasks = append(tasks, t)
			}
			tasks = append(tasks, g.queue...)
		}
		for _, t := range tasks {
			if t.kind != kindRecord || t.slot != nil {
				ok = false
				break
			}
		}
		ok = ok && len(tasks) == c.admitted
	}
	if !ok {
		c.metrics.CaptureFallbacks.Add(1)
		c.log.LogAttrs(c.ctx, slog.LevelWarn, "barrier capture: admitted tasks not accounted for; draining them instead",
			slog.Uint64("checkpoint", id), slog.Int("admitted", c.admitted), slog.Int("found", len(tasks)))
		c.drainOnly = true
		c.unfreeze()
		return false
	}
	// Each key's records are in its order (the key's task, then its queue); keys follow one
	// another in the gate's order, which is as good as any: only per-key order is kept. (A
	// sort by arrival cost a quarter of a capture of 75k records, in cache misses.)
	n := 1 + 2*binary.MaxVarintLen64
	for _, t := range tasks {
		n += len(t.key) + len(t.value) + 4*binary.MaxVarintLen64
	}
	b := make([]byte, 0, n)
	b = append(b, 1)
	b = binary.AppendVarint(b, c.epochs[0].startWM)
	b = binary.AppendUvarint(b, uint64(len(tasks)))
	for _, t := range tasks {
		b = appendCaptured(b, t.key, t.value, t.ts, t.pos)
	}
	c.cfg.Backend.SetOperatorState(InputStateName, b)
	c.inputSet = true
	for _, t := range tasks {
		t.captured = true
	}
	c.capturedLeft = len(tasks)
	m := int64(len(tasks))
	c.metrics.CapturedRecords.Add(m)
	c.metrics.CapturedBytes.Add(int64(len(b)))
	if m > c.metrics.MaxCaptured.Load() {
		c.metrics.MaxCaptured.Store(m)
	}
	return true
}

// unfreeze lets the frozen tasks start their calls (after the capture, or when it fell back
// to a drain). They hold their keys: any order among them keeps per-key order.
func (c *Controller) unfreeze() {
	c.runnable.pushAll(c.frozen)
	clear(c.frozen)
	c.frozen = c.frozen[:0]
}
