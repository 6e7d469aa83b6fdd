package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// # Subtasks
//
// Every subtask is one goroutine (plus, for operators, the scheduler's carriers and a
// persister) with the lifecycle of the seed's StreamTask: open (backends, writers, readers are
// opened by the attempt before any record moves), process, timers (the controller's epochs),
// flush (barriers), close. The closed-and-drained rule: a subtask finishes only once every
// input channel is closed and drained, then closes its outputs, so the end of a bounded input
// travels through the DAG behind the last record, watermark and final barrier. A failure
// anywhere cancels the attempt's context; every blocking send and receive selects on it, so
// the attempt winds down without leaking a goroutine, and the first real error is reported.

// --- sources ---

type sourceTask struct {
	a       *attempt
	spec    *SourceSpec
	subtask int
	r       SourceReader
	splits  []Split
	trig    chan trigger
	out     *router

	records  atomic.Int64 // published after each read
	read     int64        // records of the current read (the subtask's)
	skipped  atomic.Int64
	lastWM   int64
	splitMax []int64 // per split: largest event time seen
	lastSeen []time.Time
	sinceWM  int
}

func (t *sourceTask) name() string { return fmt.Sprintf("source %s[%d]", t.spec.Name, t.subtask) }

func (t *sourceTask) run() error {
	ctx := t.out.ctx
	defer t.r.Close()
	t.lastWM = math.MinInt64
	t.splitMax = make([]int64, len(t.splits))
	t.lastSeen = make([]time.Time, len(t.splits))
	for i := range t.splitMax {
		t.splitMax[i] = math.MinInt64
		t.lastSeen[i] = time.Now()
	}
	// Read enough per call that, spread over the downstream subtasks, each channel still gets
	// batches of about batchRecords: at parallelism 2 a read of batchRecords sent two
	// half-full batches, twice the channel operations per record.
	fan := 1
	for _, e := range t.out.all() {
		fan = max(fan, len(e.chans))
	}
	buf := make([]SourceRecord, batchRecords*min(fan, 8))
	eof := len(t.splits) == 0
	c := t.a.coord
	for {
		// Barriers first: a trigger is answered between two reads.
		if eof {
			select {
			case tr := <-t.trig:
				if done, err := t.barrier(ctx, tr); done || err != nil {
					return err
				}
				continue
			case <-ctx.Done():
				return nil
			}
		}
		select {
		case tr := <-t.trig:
			if done, err := t.barrier(ctx, tr); done || err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		default:
		}
		n, err := t.r.Read(ctx, buf)
		for i := range n {
			if err := t.record(&buf[i]); err != nil {
				return err
			}
			if err := t.maybeWatermark(1); err != nil {
				return nil // cancelled
			}
		}
		t.records.Add(t.read) // published once a read, not once a record
		t.read = 0
		if n == 0 {
			if err := t.maybeWatermark(0); err != nil { // idle splits
				return nil
			}
		}
		if err := t.out.flush(); err != nil {
			return nil // cancelled
		}
		if errors.Is(err, io.EOF) {
			eof = true
			if err := t.out.mark(scheduler.Element{Kind: scheduler.ElementWatermark, TS: math.MaxInt64}); err != nil {
				return nil
			}
			c.send(ctx, ack{kind: ackEOF, node: t.spec.Name, subtask: t.subtask})
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("%s: %w", t.name(), err)
		}
	}
}

// barrier records positions, acknowledges them and sends the barrier. A final barrier ends
// the subtask: it closes its outputs.
func (t *sourceTask) barrier(ctx context.Context, tr trigger) (bool, error) {
	t.a.coord.send(ctx, ack{kind: ackSource, node: t.spec.Name, subtask: t.subtask, id: tr.id, splits: t.r.Positions()})
	if err := t.out.mark(scheduler.Element{Kind: scheduler.ElementBarrier, CheckID: tr.id}); err != nil {
		return true, nil
	}
	if tr.final {
		if err := t.out.close(); err != nil {
			return true, nil
		}
		return true, nil
	}
	return false, nil
}

func (t *sourceTask) record(r *SourceRecord) error {
	if r.Malformed == nil {
		ts, err := t.timestamp(r)
		if err == nil {
			t.read++
			return t.out.route(t.out.main, r.Key, r.Value, ts, r.Pos)
		}
		r.Malformed = err
	}
	if t.spec.OnMalformed != MalformedSkip {
		return &MalformedError{Line: r.Pos, Err: fmt.Errorf("%s: %w", t.name(), r.Malformed)}
	}
	t.skipped.Add(1)
	side := t.out.side["malformed"]
	if len(side) == 0 {
		return nil
	}
	b, _ := json.Marshal(struct {
		Source string `json:"source"`
		Pos    int64  `json:"pos"`
		Error  string `json:"error"`
		Raw    string `json:"raw"`
	}{t.spec.Name, r.Pos, r.Malformed.Error(), string(r.Value)})
	return t.out.route(side, nil, b, time.Now().UnixMilli(), r.Pos)
}

// timestamp takes the record's event time and advances its split's watermark.
func (t *sourceTask) timestamp(r *SourceRecord) (int64, error) {
	et := t.spec.EventTime
	var ts int64
	switch {
	case et != nil && et.Field != "":
		raw, ok := topLevelField(r.Value, et.Field)
		if !ok {
			return 0, fmt.Errorf("no %q field for the event time", et.Field)
		}
		v, err := parseTime(raw)
		if err != nil {
			return 0, fmt.Errorf("field %q: %w", et.Field, err)
		}
		ts = v
	case r.HasTS:
		ts = r.TS
	default:
		return time.Now().UnixMilli(), nil // ingestion time: no event-time watermarks
	}
	if et != nil && r.Split >= 0 && r.Split < len(t.splitMax) {
		t.splitMax[r.Split] = max(t.splitMax[r.Split], ts)
		t.lastSeen[r.Split] = time.Now()
	}
	return ts, nil
}

// maybeWatermark emits the subtask's watermark: the minimum over its active splits of the
// split's largest timestamp minus the out-of-orderness bound. A split idle for longer than
// idle_timeout does not hold it back; when every split is idle the largest is used.
func (t *sourceTask) maybeWatermark(n int) error {
	et := t.spec.EventTime
	if et == nil {
		return nil
	}
	t.sinceWM += n
	idleTimeout := et.IdleTimeout.D()
	if t.sinceWM < et.WatermarkEvery && (n > 0 || idleTimeout == 0) {
		return nil
	}
	t.sinceWM = 0
	now := time.Now()
	wm, any := int64(math.MaxInt64), false
	best := int64(math.MinInt64)
	for i, m := range t.splitMax {
		best = max(best, m)
		if idleTimeout > 0 && now.Sub(t.lastSeen[i]) > idleTimeout {
			continue
		}
		any = true
		wm = min(wm, m)
	}
	if !any {
		wm = best
	}
	if wm == math.MinInt64 {
		return nil
	}
	wm -= et.MaxOutOfOrderness.D().Milliseconds()
	if wm <= t.lastWM {
		return nil
	}
	t.lastWM = wm
	return t.out.mark(scheduler.Element{Kind: scheduler.ElementWatermark, TS: wm})
}

// --- operators ---

type operatorTask struct {
	a       *attempt
	op      *opNode
	subtask int
	backend *state.Tiered
	in      *merger
	out     *router
	lateOut *router // the late side output, used by the input merger
	ctrl    atomic.Pointer[scheduler.Controller]

	persistQ chan persistJob
	persistE chan error

	deadLetters atomic.Int64
}

type persistJob struct {
	id   uint64
	snap state.Snapshot
}

func (t *operatorTask) name() string { return fmt.Sprintf("%s[%d]", t.op.spec.Name, t.subtask) }

func (t *operatorTask) describe(pos int64) string {
	if f := t.a.env.flag; f != nil {
		return f.describe(pos)
	}
	return fmt.Sprintf("the record at source position %d (operator %s)", pos, t.name())
}

func (t *operatorTask) run() (err error) {
	defer func() {
		// A chained sink's failure is the sink's, whatever the runner made of it (the
		// operator call whose output it was writing fails with it).
		if cerr := t.out.chainedErr(); cerr != nil {
			err = cerr
		}
		t.out.abandonChained() // a no-op once close ended them
	}()
	return t.runOperator()
}

func (t *operatorTask) runOperator() error {
	ctx := t.out.ctx
	a := t.a
	if newOp := a.env.Native[t.op.spec.Name]; newOp != nil {
		return t.runNative(ctx, newOp())
	}
	var lookupFn scheduler.LookupFunc
	if len(t.op.spec.Endpoints) > 0 {
		reg := a.env.Lookups
		if reg == nil {
			reg = lookup.NewRegistry()
		}
		fn, closeLookups, err := openLookups(reg, a.spec.Tenant, t.op.spec.Endpoints, t.op.mod.Manifest.Endpoints)
		if err != nil {
			return fmt.Errorf("operator %s: %w", t.name(), err)
		}
		defer func() { t.a.env.flag.lookupsDone(closeLookups()) }()
		lookupFn = fn
		if g := a.env.LookupGate; g != nil {
			lookupFn = gateLookups(g, fn)
		}
	}
	var backend state.Backend = t.backend
	var sink scheduler.Sink = t.out
	var tapErr func() error
	record := a.env.flag.recording()
	if record != nil {
		backend, sink = record.Backend(t.backend), record.Sink(t.out)
		if err := backend.Open(t.op.mod.Manifest.States); err != nil { // the recording learns the state names
			return fmt.Errorf("operator %s: %w", t.name(), err)
		}
		lookupFn = record.Lookup(lookupFn, t.op.mod.Manifest.Endpoints)
		t.in.tapped = true
	}
	order := scheduler.OrderPerKey
	switch t.op.spec.Order {
	case "input":
		order = scheduler.OrderInput
	case "none":
		order = scheduler.OrderNone
	}
	t.persistQ = make(chan persistJob, 4)
	t.persistE = make(chan error, 1)
	go t.persister(ctx)
	ctrl, err := scheduler.New(t.op.mod, backend, sink,
		scheduler.WithLookup(lookupFn), scheduler.WithOrder(order),
		scheduler.WithGuestLog(a.env.guestLog(t.describe)), scheduler.WithMaxInFlight(t.op.maxInFlight()),
		scheduler.WithDescribe(t.describe), scheduler.WithOnBarrier(t.onBarrier),
		scheduler.WithLogger(a.log.With("subtask", t.name())), scheduler.WithLookupContext(t.lookupContext),
		scheduler.WithOnRecordFailure(t.onRecordFailure), scheduler.WithRecordRetries(t.op.spec.Retries),
		scheduler.WithInputRelease(t.in.batches.releaser()), scheduler.WithBarrierCapture(t.captureAt))
	if err != nil {
		close(t.persistQ)
		return fmt.Errorf("operator %s: %w", t.name(), err)
	}
	t.ctrl.Store(ctrl)
	t.applyLiveInFlight() // a SetLimits between maxInFlight() and the Store above
	in, cancelIn, waitIn := t.in.start(ctx)
	defer cancelIn()
	merged := in
	if record != nil {
		in, tapErr = tapInput(in, record.Elements)
	}
	runErr := ctrl.Run(ctx, in)
	if runErr != nil {
		cancelIn()
	}
	if in != merged {
		for range in { // the tap's output: let it finish if the controller stopped early
		}
	}
	mErr := waitIn()
	close(t.persistQ)
	pErr := <-t.persistE
	t.a.env.flag.operatorDone(ctrl, t.backend)
	if runErr == nil && tapErr != nil {
		runErr = tapErr()
	}
	if runErr != nil {
		return runErr
	}
	if mErr != nil {
		return mErr
	}
	if pErr != nil {
		return pErr
	}
	if ctx.Err() != nil {
		return nil
	}
	return t.out.close()
}

// onRecordFailure takes a record whose guest call faulted without effect: with on_error
// dead-letter it goes to the side output NAME.errors (on the runner, which owns t.out), and the
// job goes on; otherwise the fault fails the job.
func (t *operatorTask) onRecordFailure(f scheduler.RecordFailure) error {
	side := t.out.side["errors"]
	if t.op.spec.OnError != "dead-letter" || len(side) == 0 {
		return f.Err
	}
	var rec struct {
		Operator  string  `json:"operator"`
		Subtask   int     `json:"subtask"`
		Pos       int64   `json:"pos"`
		Key       string  `json:"key"`
		Attempts  int     `json:"attempts"`
		Reason    string  `json:"reason"`
		Raw       *string `json:"raw,omitempty"`
		RawBase64 *string `json:"raw_base64,omitempty"`
	}
	rec.Operator, rec.Subtask, rec.Pos, rec.Key, rec.Attempts, rec.Reason = t.op.spec.Name, t.subtask, f.Pos, string(f.Key), f.Attempts, f.Err.Error()
	if utf8.Valid(f.Value) {
		r := string(f.Value)
		rec.Raw = &r
	} else {
		r := base64.StdEncoding.EncodeToString(f.Value)
		rec.RawBase64 = &r
	}
	b, err := json.Marshal(&rec)
	if err != nil {
		return err
	}
	t.deadLetters.Add(1)
	return t.out.route(side, f.Key, b, f.TS, f.Pos)
}

// lookupContext gives each lookup an idempotency key derived from the job, the operator, the
// record that makes it (its source position, key and value; a timer's key and time) and the
// lookup's index in that call. A record replayed after a restore makes the same calls and so
// presents the same keys; host/lookup sends the key with non-idempotent requests (POST,
// PATCH) as the Idempotency-Key header.
func (t *operatorTask) lookupContext(ctx context.Context, c scheduler.LookupCall) context.Context {
	return lookup.WithIdempotencyKey(ctx, lookupIdempotencyKey(t.a.spec.Tenant, t.a.spec.Name, t.op.spec.Name, c))
}

func lookupIdempotencyKey(tenant, job, operator string, c scheduler.LookupCall) string {
	h := sha256.New()
	var n [8]byte
	field := func(b []byte) {
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	field([]byte(tenant))
	field([]byte(job))
	field([]byte(operator))
	if c.Timer {
		field([]byte("timer"))
		binary.LittleEndian.PutUint64(n[:], uint64(c.TS))
	} else {
		field([]byte("record"))
		binary.LittleEndian.PutUint64(n[:], uint64(c.Pos))
	}
	h.Write(n[:])
	field(c.Key)
	if !c.Timer {
		field(c.Value)
	}
	binary.LittleEndian.PutUint64(n[:], uint64(c.Index))
	h.Write(n[:])
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// captureAt tells the scheduler whether barrier id may capture records instead of draining
// them: every barrier but a final one, after which the run ends and no later checkpoint covers
// what the captured records output (a stop with a savepoint, the end of a bounded input).
func (t *operatorTask) captureAt(id uint64) bool { return !t.a.coord.info(id).final }

// onBarrier runs on the runner once the barrier's calls in progress have completed (records
// admitted but not started are in the backend's operator state by then, as the checkpoint's
// captured input: see host/scheduler/capture.go): capture, and hand the persist to the
// persister so the runner goes on at once (persist off the runner).
func (t *operatorTask) onBarrier(id uint64) error {
	tr := t.a.coord.info(id)
	var snap state.Snapshot
	var err error
	if tr.savepoint {
		snap, err = t.backend.CaptureSavepoint(id)
	} else {
		snap, err = t.backend.Capture(id)
	}
	if err != nil {
		return err
	}
	select {
	case t.persistQ <- persistJob{id: id, snap: snap}:
		return nil
	case <-t.out.ctx.Done():
		return context.Cause(t.out.ctx)
	}
}

// persister persists snapshots in capture order and acknowledges each once durable.
func (t *operatorTask) persister(ctx context.Context) {
	var first error
	for j := range t.persistQ {
		if first != nil {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, t.a.spec.Checkpoints.Timeout.D())
		err := j.snap.Persist(pctx)
		cancel()
		if err != nil {
			first = fmt.Errorf("operator %s: persisting checkpoint %d: %w", t.name(), j.id, err)
			t.a.coord.send(ctx, ack{kind: ackOperator, node: t.op.spec.Name, subtask: t.subtask, id: j.id, err: first})
			continue
		}
		t.a.coord.send(ctx, ack{kind: ackOperator, node: t.op.spec.Name, subtask: t.subtask, id: j.id, bytes: j.snap.Bytes()})
	}
	t.persistE <- first
}

// lateRecord sends a late record to the operator's late side output.
func (t *operatorTask) lateRecord(el *scheduler.Element) error {
	side := t.lateOut.side["late"]
	if len(side) == 0 {
		return nil
	}
	return t.lateOut.route(side, el.Key, el.Value, el.TS, el.Pos)
}

// --- sinks ---

type sinkTask struct {
	a       *attempt
	name    string
	subtask int
	w       SinkWriter
	in      *merger
	records atomic.Int64
}

func (t *sinkTask) run() error { return t.loop(t.a.ctx) }

func (t *sinkTask) loop(ctx context.Context) error {
	in, cancelIn, waitIn := t.in.start(ctx)
	defer cancelIn()
	var recs []SinkRecord
	flush := func() error {
		if len(recs) == 0 {
			return nil
		}
		err := t.w.Write(ctx, recs)
		t.records.Add(int64(len(recs)))
		recs = recs[:0]
		return err
	}
	fail := func(err error) error {
		cancelIn() // as an operator does: an input that never ends would hold the failure back
		waitIn()
		t.w.Close(context.WithoutCancel(ctx))
		return fmt.Errorf("sink %s[%d]: %w", t.name, t.subtask, err)
	}
	for {
		var b []scheduler.Element
		select {
		case bb, ok := <-in:
			b = bb
			if !ok {
				in = nil
			}
		case <-ctx.Done(): // a channel passed through need not be closed after a failure
			in = nil
		}
		if in == nil {
			break
		}
		for i := range b {
			el := &b[i]
			switch el.Kind {
			case scheduler.ElementRecord:
				recs = append(recs, SinkRecord{Key: el.Key, Value: el.Value, TS: el.TS, Pos: el.Pos})
			case scheduler.ElementBarrier:
				if err := flush(); err != nil {
					return fail(err)
				}
				h, err := t.w.PreCommit(ctx, el.CheckID)
				if err != nil {
					return fail(fmt.Errorf("pre-committing checkpoint %d: %w", el.CheckID, err))
				}
				t.a.coord.send(ctx, ack{kind: ackSink, node: t.name, subtask: t.subtask, id: el.CheckID, handle: h})
			}
		}
		if err := flush(); err != nil {
			return fail(err)
		}
		t.in.batches.release(b) // written: SinkWriter.Write keeps nothing
	}
	if err := waitIn(); err != nil || ctx.Err() != nil {
		t.w.Close(context.WithoutCancel(ctx))
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if err := t.w.Close(ctx); err != nil {
		return fmt.Errorf("sink %s[%d]: %w", t.name, t.subtask, err)
	}
	return nil
}

// guestLog routes guest log lines to the environment's writer.
func (e *Env) guestLog(describe func(int64) string) scheduler.LogFunc {
	if e.GuestLog == nil {
		return nil
	}
	return scheduler.WriterLog(e.GuestLog, describe)
}
