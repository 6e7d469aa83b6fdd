package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// # Channels and backpressure
//
// Records cross subtasks in batches of scheduler.Elements over bounded Go channels: one
// channel per (upstream subtask, downstream subtask) pair of an edge, with room for
// channelBatches batches of at most batchRecords records. A full channel blocks its sender,
// so backpressure travels from a slow sink back to the sources, and memory stays bounded by
// channels × channelBatches × batchRecords records. Watermarks and barriers travel in the same
// channels, in order, to every downstream subtask.
//
// INVARIANT: an edgeOut (its batches and arena) is used by one goroutine. The late side
// output is the one channel with two senders: late records come from the operator's input
// merger, through edgeOuts of its own, and watermarks and barriers from the runner. The merger
// flushes its late records after each input batch, before it passes on the barrier that follows
// them, so they precede that barrier in the channel: the order per channel is the cut's.

const (
	channelBatches = 4
	batchRecords   = 256
)

// channel is one bounded edge channel with its names for logs and gauges.
type channel struct {
	ch       chan []scheduler.Element
	from, to string
	// side marks a side output's channel: its records are behind the watermark by nature
	// (late records) and are never judged late again.
	side bool
	// ready, shared by the input channels of one downstream subtask (set by its merger),
	// gets a token after each batch sent and at the close, so that the merger can wait for
	// any of its inputs without a goroutine per input.
	ready chan struct{}
	// pool, set before the attempt's goroutines start when the downstream subtask releases
	// its input batches, is where the sender takes them from (batchpool.go); nil: every batch
	// is new and left to the garbage collector.
	pool *batchPool
}

// signal tells the downstream merger that the channel has something new (a batch, or its end).
func (c *channel) signal() {
	if c.ready != nil {
		select {
		case c.ready <- struct{}{}:
		default: // a token is already waiting
		}
	}
}

// closeSignal closes the channel (the end of its input) and tells the merger.
func (c *channel) closeSignal() {
	close(c.ch)
	c.signal()
}

func newChannel(from, to string) *channel {
	return &channel{ch: make(chan []scheduler.Element, channelBatches), from: from, to: to}
}

// send delivers a batch, blocking while the channel is full. A send blocked for longer than
// stuckAfter is logged once (and again every stuckAfter) so a stalled pipeline says where.
func (c *channel) send(ctx context.Context, b []scheduler.Element, log *slog.Logger, stuckAfter time.Duration) error {
	select {
	case c.ch <- b:
		c.signal()
		return nil
	default:
	}
	t := time.NewTimer(stuckAfter)
	defer t.Stop()
	start := time.Now()
	for {
		select {
		case c.ch <- b:
			c.signal()
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
			log.Warn("channel stuck: the downstream subtask is not taking input",
				"from", c.from, "to", c.to, "blocked", time.Since(start).Round(time.Millisecond), "depth", len(c.ch))
			t.Reset(stuckAfter)
		}
	}
}

// keyFunc extracts the routing key of a record for a hash edge.
type keyFunc func(value, srcKey []byte) ([]byte, error)

// edgeOut is the sending end of an edge at one upstream subtask.
type edgeOut struct {
	forward bool // chain: to the downstream subtask with the same index
	keyOf   keyFunc
	chans   []*channel // by downstream subtask; one for forward
	batches []*batch   // the batch being filled per downstream subtask, nil when none
	numKG   int
	par     int // downstream parallelism
	// kgOwner maps a key group to its downstream subtask.
	kgOwner []int
	arena   []byte
	// roundRobin spreads records over the downstream subtasks in turn, whatever their key:
	// the edge into an unkeyed operator (order input or none) at parallelism > 1. next is
	// the subtask of the next record.
	roundRobin bool
	next       int
	// sink, when set, is the sink subtask chained to this edge (chain.go): no channel.
	sink *chainedSink
}

func newEdgeOut(forward bool, keyOf keyFunc, chans []*channel, par, numKG int) *edgeOut {
	e := &edgeOut{forward: forward, keyOf: keyOf, chans: chans, batches: make([]*batch, len(chans)), numKG: numKG, par: par}
	e.kgOwner = make([]int, numKG)
	for i := range par {
		r := state.KeyGroupRangeFor(i, par, numKG)
		for kg := r.Lo; kg < r.Hi; kg++ {
			e.kgOwner[kg] = i
		}
	}
	return e
}

// open returns the batch being filled for downstream subtask idx, starting one if none is.
func (e *edgeOut) open(idx int) *batch {
	if b := e.batches[idx]; b != nil {
		return b
	}
	var b *batch
	if p := e.chans[idx].pool; p != nil {
		b = p.get()
	} else {
		b = &batch{els: make([]scheduler.Element, 0, batchRecords)}
	}
	e.batches[idx] = b
	return b
}

// copyBytes copies k and v into an unpooled channel's arena, which the edge shares between
// its batches: elements alias arenas that are never reused, because the downstream
// controller may hold a record for as long as it is in flight.
func (e *edgeOut) copyBytes(k, v []byte) []byte {
	n := len(k) + len(v)
	if n > cap(e.arena)-len(e.arena) {
		e.arena = make([]byte, 0, max(64<<10, n))
	}
	start := len(e.arena)
	e.arena = append(append(e.arena, k...), v...)
	return e.arena[start:len(e.arena):len(e.arena)]
}

// router is the output side of a subtask: its main output and side outputs, each a list of
// edges.
type router struct {
	name       string // "operator count[1]"
	ctx        context.Context
	log        *slog.Logger
	stuckAfter time.Duration
	main       []*edgeOut
	side       map[string][]*edgeOut // side output name -> edges
	subtask    int
	records    atomic.Int64 // records routed, published at each flush (a gauge, read anywhere)
	routed     int64        // records routed since the last publication (the owner's)
	edges      []*edgeOut   // all's, once made
}

// all is every edge of every output, made once (the edges are fixed once the router is
// built; only the router's goroutine calls it).
func (r *router) all() []*edgeOut {
	if r.edges == nil {
		r.edges = append([]*edgeOut{}, r.main...)
		for _, es := range r.side {
			r.edges = append(r.edges, es...)
		}
	}
	return r.edges
}

// route appends a record to the edges of one output.
func (r *router) route(edges []*edgeOut, key, value []byte, ts, pos int64) error {
	for _, e := range edges {
		if e.sink != nil {
			if err := e.sink.add(r.ctx, key, value, ts, pos); err != nil {
				return err
			}
			continue
		}
		idx := 0
		k := key
		if e.forward {
			if e.par > 1 {
				if kg := state.KeyGroupOf(k, e.numKG); e.kgOwner[kg] != r.subtask {
					return fmt.Errorf("%s emitted key %q, whose key group %d belongs to another subtask of the chained operator downstream (chain only operators that keep their input's key, or re-key with a key)", r.name, k, kg)
				}
			}
		} else if e.roundRobin {
			idx = e.next
			if e.next++; e.next == len(e.chans) {
				e.next = 0
			}
		} else {
			if e.keyOf != nil {
				var err error
				if k, err = e.keyOf(value, key); err != nil {
					return err
				}
			}
			if len(e.chans) > 1 { // one downstream subtask owns every key group
				idx = e.kgOwner[state.KeyGroupOf(k, e.numKG)]
			}
		}
		b := e.open(idx)
		var kv []byte
		if b.pooled {
			if !b.room(len(k) + len(value)) {
				if err := r.sendBatch(e, idx); err != nil {
					return err
				}
				b = e.open(idx)
				b.room(len(k) + len(value))
			}
			kv = b.add(k, value)
		} else {
			kv = e.copyBytes(k, value)
		}
		b.els = append(b.els, scheduler.Element{Kind: scheduler.ElementRecord, Key: kv[:len(k):len(k)], Value: kv[len(k):], TS: ts, Pos: pos})
		if len(b.els) == batchRecords {
			if err := r.sendBatch(e, idx); err != nil {
				return err
			}
		}
	}
	r.routed++
	return nil
}

func (r *router) sendBatch(e *edgeOut, idx int) error {
	b := e.batches[idx]
	if b == nil || len(b.els) == 0 {
		return nil
	}
	e.batches[idx] = nil
	return e.chans[idx].send(r.ctx, b.els, r.log, r.stuckAfter)
}

// mark sends a watermark or barrier to every downstream subtask of every output, after the
// records before it.
func (r *router) mark(el scheduler.Element) error {
	for _, e := range r.all() {
		if e.sink != nil && el.Kind == scheduler.ElementBarrier {
			if err := e.sink.barrier(r.ctx, el.CheckID); err != nil {
				return err
			}
		}
		for idx := range e.chans {
			if b := e.batches[idx]; b != nil && len(b.els) == cap(b.els) {
				if err := r.sendBatch(e, idx); err != nil { // (route sends a full batch at once)
					return err
				}
			}
			b := e.open(idx)
			b.els = append(b.els, el)
			if err := r.sendBatch(e, idx); err != nil {
				return err
			}
		}
	}
	return nil
}

// flush sends every partial batch.
func (r *router) flush() error {
	if r.routed > 0 {
		r.records.Add(r.routed)
		r.routed = 0
	}
	for _, e := range r.all() {
		if e.sink != nil {
			if err := e.sink.flush(r.ctx); err != nil {
				return err
			}
		}
		for idx := range e.chans {
			if err := r.sendBatch(e, idx); err != nil {
				return err
			}
		}
	}
	return nil
}

// close flushes and closes every output channel: the closed-and-drained rule's first half
// (a downstream subtask finishes once all its inputs are closed and drained).
func (r *router) close() error {
	err := r.flush()
	for _, e := range r.all() {
		for _, c := range e.chans {
			c.closeSignal()
		}
		if e.sink != nil {
			if serr := e.sink.close(r.ctx); err == nil {
				err = serr
			}
		}
	}
	return err
}

// chainedErr is the first failure of a chained sink, if any.
func (r *router) chainedErr() error {
	for _, e := range r.main {
		if e.sink != nil && e.sink.err != nil {
			return e.sink.err
		}
	}
	return nil
}

// abandonChained closes the writers of the chained sinks that close did not (the subtask
// failed or was cancelled).
func (r *router) abandonChained() {
	for _, e := range r.main {
		if e.sink != nil {
			e.sink.abandon(r.ctx)
		}
	}
}

// Write implements scheduler.Sink for an operator subtask: data to the main output,
// watermarks and barriers to every output.
func (r *router) Write(b *scheduler.Batch) error {
	defer b.Release()
	for i := range b.Outputs {
		o := &b.Outputs[i]
		var err error
		switch o.Kind {
		case scheduler.OutputData:
			err = r.route(r.main, o.Key, o.Value, o.TS, o.Src.Pos)
		case scheduler.OutputWatermark:
			err = r.mark(scheduler.Element{Kind: scheduler.ElementWatermark, TS: o.TS})
		case scheduler.OutputBarrier:
			err = r.mark(scheduler.Element{Kind: scheduler.ElementBarrier, CheckID: uint64(o.TS)})
		}
		if err != nil {
			return err
		}
	}
	return r.flush()
}

// fieldKey keys by a top-level field, with the source's checks.
func fieldKey(field string, maxKey int) keyFunc {
	return func(value, _ []byte) ([]byte, error) {
		k, ok, err := topLevelKey(value, field)
		if !ok {
			return nil, fmt.Errorf("no %q field to key by", field)
		}
		if err != nil {
			return nil, fmt.Errorf("field %q: %w", field, err)
		}
		if len(k) > maxKey {
			return nil, fmt.Errorf("key of %d bytes exceeds the %d-byte limit", len(k), maxKey)
		}
		return k, nil
	}
}

// guestKey keys by the downstream module's clink_key on an instance private to the sender.
func guestKey(ctx context.Context, mod *abi.Module) (keyFunc, func(), error) {
	in, err := mod.Instantiate(ctx, keyOnlyHandler{})
	if err != nil {
		return nil, nil, err
	}
	return func(value, _ []byte) ([]byte, error) {
		k, err := in.Key(value)
		if err != nil {
			return nil, fmt.Errorf("%s's key function: %w", mod.Name(), err)
		}
		return k, nil
	}, func() { in.Close(context.WithoutCancel(ctx)) }, nil
}

// keyOnlyHandler serves a key-function instance: nothing but the key function is allowed.
type keyOnlyHandler struct{}

func (keyOnlyHandler) Get(uint32, []byte) ([]byte, bool, error) { return nil, false, abi.NotAllowed }
func (keyOnlyHandler) Put(uint32, []byte, []byte) error         { return abi.NotAllowed }
func (keyOnlyHandler) Delete(uint32, []byte) error              { return abi.NotAllowed }
func (keyOnlyHandler) Emit([]byte, []byte) error                { return abi.NotAllowed }
func (keyOnlyHandler) RegisterTimer(int64) error                { return abi.NotAllowed }
func (keyOnlyHandler) DeleteTimer(int64) error                  { return abi.NotAllowed }
func (keyOnlyHandler) Watermark() int64                         { return math.MinInt64 }
func (keyOnlyHandler) Lookup(uint32, []byte) (int, []byte, error) {
	return 0, nil, abi.LookupUnavailable
}
func (keyOnlyHandler) Log(abi.LogLevel, []byte) {}
func (keyOnlyHandler) SetResumeOrder(int64)     {}

// --- input side ---

// merger is the input side of a subtask with one or more input channels. It aligns barriers
// (an input that delivered barrier n is blocked until every open input has delivered it),
// forwards the minimum watermark across inputs, and diverts late records.
type merger struct {
	ins   []*channel
	out   chan []scheduler.Element
	ready chan struct{} // every input's channel.ready
	// pend[i] is what is left of input i's last batch after a barrier: held, with the
	// input, until the barrier is aligned.
	pend    [][]scheduler.Element
	wm      []int64
	done    []bool
	blocked []bool
	emitted int64
	// late receives records at or before the watermark already forwarded (nil: dropped);
	// lateFlush sends what late buffered, after each input batch.
	late      func(el *scheduler.Element) error
	lateFlush func() error
	// checkLate enables late-record detection (operators; never sinks).
	checkLate bool
	// tapped: a recording reads the merger's output (the flag form's), so it must run.
	tapped bool
	// eventTime: some source of the job has event time, so watermarks other than the final
	// one travel the channels.
	eventTime bool
	dropped   atomic.Int64
	// batches is the pool the subtask releases its input batches to; nil: not pooled.
	batches *batchPool
}

// passThrough reports whether the merger would only hand its input on: one channel (barriers
// align trivially, the minimum watermark is that channel's, which its one sender only ever
// raises), and no record can be late (late detection is off, or the job has no event time, so
// no watermark precedes the end of input). The subtask then reads the channel itself, without
// the reader and merger goroutines and their two hand-overs per batch.
func (m *merger) passThrough() bool {
	return len(m.ins) == 1 && (!m.checkLate || !m.eventTime) && !m.tapped
}

// start runs the merger for a subtask and returns the subtask's input; cancel, which ends the
// merger early (after the subtask stopped before the end of its input: an endless input would
// never let it finish on its own); and wait, which drains what the merger still sends and
// returns its error. A merger that passes through (passThrough) starts nothing: the input is
// the channel itself, cancel and wait do nothing, and the subtask must not drain the channel
// after an early stop (its upstream need not close it then: it sees the attempt's
// cancellation instead).
func (m *merger) start(ctx context.Context) (in <-chan []scheduler.Element, cancel func(), wait func() error) {
	if m.passThrough() {
		return m.ins[0].ch, func() {}, func() error { return nil }
	}
	errc := make(chan error, 1)
	mctx, mcancel := context.WithCancel(ctx)
	go func() { errc <- m.run(mctx) }()
	return m.out, mcancel, func() error {
		for range m.out {
		}
		err := <-errc
		mcancel()
		return err
	}
}

// pool makes the merger's input channels pooled (batchpool.go): the subtask promises to
// release every batch it takes from its input, and the senders take their batches from p.
// Called before the attempt's goroutines start.
func (m *merger) pool(p *batchPool) {
	m.batches = p
	for _, c := range m.ins {
		c.pool = p
	}
}

func newMerger(ins []*channel) *merger {
	m := &merger{ins: ins, out: make(chan []scheduler.Element, 2), ready: make(chan struct{}, 1),
		pend: make([][]scheduler.Element, len(ins)), wm: make([]int64, len(ins)), done: make([]bool, len(ins)),
		blocked: make([]bool, len(ins)), emitted: math.MinInt64}
	for i, c := range ins {
		c.ready = m.ready
		m.wm[i] = math.MinInt64
	}
	return m
}

// depth is the number of batches waiting in the subtask's inputs (a gauge).
func (m *merger) depth() int {
	n := len(m.out) // empty when the merger passes through
	for _, c := range m.ins {
		n += len(c.ch)
	}
	return n
}

// run merges until every input is closed and drained, then closes out. It takes one batch
// from each input in turn, without blocking; a batch is cut at a barrier, and the input is then
// left alone (its rest held in pend) until every open input has delivered the barrier. When no
// input has anything, it waits for a token on ready, which every send and close leaves after
// its batch is in the channel, so no batch is missed between the look and the wait.
func (m *merger) run(ctx context.Context) error {
	defer close(m.out)
	open := len(m.ins)
	var barrier *scheduler.Element
	aligned := 0
	emit := func(b []scheduler.Element) error {
		if len(b) == 0 {
			return nil
		}
		select {
		case m.out <- b:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	checkBarrier := func() error {
		if barrier == nil || aligned < open {
			return nil
		}
		if err := emit([]scheduler.Element{*barrier}); err != nil {
			return err
		}
		barrier, aligned = nil, 0
		clear(m.blocked)
		return nil
	}
	for open > 0 {
		progress := false
		for idx, c := range m.ins {
			if m.done[idx] || m.blocked[idx] {
				continue
			}
			b := m.pend[idx]
			m.pend[idx] = nil
			if b == nil {
				select {
				case bb, ok := <-c.ch:
					if !ok {
						progress = true
						m.done[idx] = true
						m.wm[idx] = math.MaxInt64
						open--
						if err := m.advance(emit); err != nil {
							return err
						}
						if err := checkBarrier(); err != nil {
							return err
						}
						continue
					}
					b = bb
				default:
					continue
				}
			}
			progress = true
			cut := len(b)
			for i := range b {
				if b[i].Kind == scheduler.ElementBarrier {
					cut = i
					break
				}
			}
			// What follows a barrier waits for its alignment. Take it (and the barrier) before
			// forwarding the part before it: once forwarded, a pooled batch may be released
			// and reused at any time (batchpool.go), so its rest waits in a copy of its own.
			var bar scheduler.Element
			var rest []scheduler.Element
			if cut < len(b) {
				bar, rest = b[cut], b[cut+1:]
				if p := c.pool; p != nil && len(rest) > 0 {
					rest = p.copyOf(rest)
				}
			}
			if err := m.forward(idx, b[:cut], emit); err != nil {
				return err
			}
			if cut == len(b) {
				continue
			}
			if barrier != nil && barrier.CheckID != bar.CheckID {
				return fmt.Errorf("barrier %d arrived while aligning barrier %d", bar.CheckID, barrier.CheckID)
			}
			barrier = &bar
			m.blocked[idx] = true
			aligned++
			if len(rest) > 0 {
				m.pend[idx] = rest
			}
			if err := checkBarrier(); err != nil {
				return err
			}
		}
		if !progress {
			select {
			case <-m.ready:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
	}
	return nil
}

// forward passes on the records and watermarks of input idx (no barrier among them): the
// minimum watermark across inputs when it rises, late records to late.
//
// A pooled batch (batchpool.go) that leaves nothing to forward is released here, since no
// consumer will see it.
func (m *merger) forward(idx int, els []scheduler.Element, emit func([]scheduler.Element) error) error {
	if len(els) == 0 {
		m.ins[idx].pool.release(els)
		return nil
	}
	b := els[:0]
	for i := range els {
		// By index: a copy whose address went to late would escape, one allocation per
		// record.
		el := &els[i]
		switch el.Kind {
		case scheduler.ElementWatermark:
			if el.TS > m.wm[idx] {
				m.wm[idx] = el.TS
			}
			if w := m.minWM(); w > m.emitted {
				m.emitted = w
				b = append(b, scheduler.Element{Kind: scheduler.ElementWatermark, TS: w})
			}
		case scheduler.ElementRecord:
			if m.checkLate && !m.ins[idx].side && m.emitted != math.MinInt64 && el.TS <= m.emitted && m.emitted != math.MaxInt64 {
				m.dropped.Add(1)
				if m.late != nil {
					if err := m.late(el); err != nil {
						return err
					}
				}
				continue
			}
			b = append(b, *el)
		}
	}
	if m.lateFlush != nil {
		if err := m.lateFlush(); err != nil {
			return err
		}
	}
	if len(b) == 0 {
		m.ins[idx].pool.release(els)
		return nil
	}
	return emit(b)
}

// sideRouter returns a router for one side output of r whose edgeOuts are copies (same
// channels, own batches and arena), for a goroutine other than r's.
func (r *router) sideRouter(side string) *router {
	c := &router{name: r.name, ctx: r.ctx, log: r.log, stuckAfter: r.stuckAfter, subtask: r.subtask, side: map[string][]*edgeOut{}}
	for _, e := range r.side[side] {
		cp := *e
		cp.batches = make([]*batch, len(e.chans))
		cp.arena = nil
		c.side[side] = append(c.side[side], &cp)
	}
	return c
}

func (m *merger) minWM() int64 {
	w := int64(math.MaxInt64)
	for _, x := range m.wm {
		w = min(w, x)
	}
	return w
}

// advance forwards the minimum watermark after an input closed.
func (m *merger) advance(emit func([]scheduler.Element) error) error {
	if w := m.minWM(); w > m.emitted && w != math.MaxInt64 {
		m.emitted = w
		return emit([]scheduler.Element{{Kind: scheduler.ElementWatermark, TS: w}})
	}
	return nil
}
