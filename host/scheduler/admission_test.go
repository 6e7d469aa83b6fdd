package scheduler

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clink-wasm/clink-wasm/host/state"
)

// offer sends el to the runner if it is waiting for input right now (the bubble is blocked, so
// a runner that may admit sits in its select on the input), and reports whether it took it.
func offer(in chan<- []Element, el Element) bool {
	synctest.Wait()
	select {
	case in <- []Element{el}:
		return true
	default:
		return false
	}
}

// checkPerKey: every key's records came out in input order, each reading the count of the
// records before it (accum's n == i), and none is missing.
func checkPerKey(t *testing.T, outs []out, want map[string]uint64) {
	t.Helper()
	next := map[string]uint64{}
	for _, o := range outs {
		if o.kind != OutputData {
			continue
		}
		i := binary.LittleEndian.Uint64(o.value)
		if int64(i) == -1 {
			continue // a timer
		}
		if n := binary.LittleEndian.Uint64(o.value[8:]); i != next[o.key] || n != i {
			t.Fatalf("key %s: record %d (read %d) out, want record %d", o.key, i, n, next[o.key])
		}
		next[o.key]++
	}
	for k, n := range want {
		if next[k] != n {
			t.Fatalf("key %s: %d records out, %d in", k, next[k], n)
		}
	}
}

// startRun runs c over an unbuffered input (every receive is visible to offer).
func startRun(c *Controller) (chan<- []Element, <-chan error) {
	in := make(chan []Element)
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background(), in) }()
	return in, done
}

// TestWaitingRecordsOutsideCap: records parked behind a key whose task waits for a read hold
// no instance: they do not count against the in-flight cap while their memory is below its
// bound, so the runner goes on taking records of busy keys at the cap. A record of a free key
// is not taken at the cap: the module prefetches nothing, so the record could only wait for
// room (the runner reads one input batch ahead, and takes nothing after it). The records still
// come out in per-key order, each reading its predecessors' writes.
func TestWaitingRecordsOutsideCap(t *testing.T) {
	m := loadModule(t, "testdata/accum.wasm")
	synctest.Test(t, func(t *testing.T) {
		tier := newFakeTier(1, 10*time.Millisecond, 10*time.Millisecond, 0)
		sink := &collectSink{}
		c, err := New(m, tier, sink, WithMaxInFlight(2), WithSpareInstances(false))
		if err != nil {
			t.Fatal(err)
		}
		in, done := startRun(c)
		want := map[string]uint64{}
		pos := int64(0)
		send := func(key string) bool {
			if !offer(in, rec(key, want[key], pos+1, pos+1)) {
				return false
			}
			pos++
			want[key]++
			return true
		}
		// a and b suspend on their cold reads: the cap of 2 is full.
		if !send("a") || !send("b") {
			t.Fatal("the first two records were not admitted")
		}
		for i := range 30 {
			if !send([]string{"a", "b"}[i%2]) {
				t.Fatalf("record %d, of a busy key, was refused at a full cap: parked records count against it", i+3)
			}
		}
		if !send("c") {
			t.Fatal("the runner did not read the input batch after the parked records")
		}
		if send("d") {
			t.Fatal("record taken at a full cap behind a record of a free key, which can only wait for room")
		}
		synctest.Wait() // the runner has published its gauges
		s := c.Metrics()
		if s.InFlight != 2 || s.Parked != 30 || s.CapWaiting != 0 || s.WaitingBytes != 30*(1+8+waitOverhead) {
			t.Errorf("in flight %d, parked %d, waiting for the cap %d (%d B); want 2, 30, 0 (%d B)",
				s.InFlight, s.Parked, s.CapWaiting, s.WaitingBytes, 30*(1+8+waitOverhead))
		}
		for _, k := range []string{"d", "c", "a", "e", "d"} {
			el := rec(k, want[k], pos+1, pos+1)
			in <- []Element{el} // taken once a call finishes
			pos++
			want[k]++
		}
		close(in)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		tier.pending.Wait()
		checkPerKey(t, sink.outs, want)
		if s := c.Metrics(); s.Parked != 0 || s.CapWaiting != 0 || s.WaitingBytes != 0 || s.CapWaits != 0 {
			t.Errorf("at the end: parked %d, waiting for the cap %d (%d B), %d cap waits (want none)", s.Parked, s.CapWaiting, s.WaitingBytes, s.CapWaits)
		}
	})
}

// TestWaitingMemoryBounded: once the waiting records hold WithWaitingMemory's bytes, the cap
// counts every admitted task again, and the runner stops taking input at it.
func TestWaitingMemoryBounded(t *testing.T) {
	m := loadModule(t, "testdata/accum.wasm")
	const room = 5
	size := 1 + 8 + waitOverhead // key "a", an 8-byte value
	synctest.Test(t, func(t *testing.T) {
		tier := newFakeTier(1, 10*time.Millisecond, 10*time.Millisecond, 0)
		sink := &collectSink{}
		c, err := New(m, tier, sink, WithMaxInFlight(2), WithWaitingMemory(room*size), WithSpareInstances(false))
		if err != nil {
			t.Fatal(err)
		}
		in, done := startRun(c)
		n := uint64(0)
		for ; n < 1+room; n++ {
			if !offer(in, rec("a", n, int64(n), int64(n+1))) {
				t.Fatalf("record %d refused with %d parked, below the bound of %d", n, max(int(n)-1, 0), room)
			}
		}
		if offer(in, rec("a", n, int64(n), int64(n+1))) {
			t.Fatalf("record %d admitted with %d records (%d B) waiting, at the bound of %d B", n, room, c.Metrics().WaitingBytes, room*size)
		}
		synctest.Wait()
		if s := c.Metrics(); s.Parked != room || s.WaitingBytes != room*size {
			t.Errorf("parked %d (%d B), want %d (%d B)", s.Parked, s.WaitingBytes, room, room*size)
		}
		for ; n < 40; n++ {
			in <- []Element{rec("a", n, int64(n), int64(n+1))}
		}
		close(in)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		tier.pending.Wait()
		checkPerKey(t, sink.outs, map[string]uint64{"a": n})
		// The runner sat at the bound, input at hand, until the first read came back (10 ms
		// of the bubble's clock).
		if s := c.Metrics(); s.IdleFull < 10*time.Millisecond || s.Idle < s.IdleFull {
			t.Errorf("runner idle %v, %v of it unable to admit; want at least 10ms of the latter", s.Idle, s.IdleFull)
		}
	})
}

// TestHotRecordsRunAtCap: with the cap full of records waiting for their prefetched values, a
// record whose prefetched values are hot runs at once, and one whose values are cold waits for
// room under the cap (its read is not sent).
func TestHotRecordsRunAtCap(t *testing.T) {
	m := loadModule(t, "testdata/accumpf.wasm")
	synctest.Test(t, func(t *testing.T) {
		tier := newFakeTier(1, 10*time.Millisecond, 10*time.Millisecond, 0)
		sink := &collectSink{}
		c, err := New(m, tier, sink, WithMaxInFlight(1), WithSpareInstances(false))
		if err != nil {
			t.Fatal(err)
		}
		// h's state is hot: its record needs no read.
		tier.hot[tier.enc(state.Key{Record: []byte("h")})] = hotEntry{val: binary.LittleEndian.AppendUint64(nil, 0), found: true}
		in, done := startRun(c)
		if !offer(in, rec("x", 0, 1, 1)) {
			t.Fatal("the first record was refused")
		}
		if !offer(in, rec("h", 0, 2, 2)) {
			t.Fatal("a record with hot values was refused at the cap")
		}
		synctest.Wait()
		sink.mu.Lock()
		outs := len(sink.outs)
		sink.mu.Unlock()
		if outs != 1 {
			t.Fatalf("%d outputs while x's read is out, want h's", outs)
		}
		if !offer(in, rec("y", 0, 3, 3)) {
			t.Fatal("a record with cold values was refused at the cap with room for waiting records")
		}
		synctest.Wait()
		if s := c.Metrics(); s.CapWaiting != 1 || tier.fetches.Load() != 1 {
			t.Errorf("%d records waiting for the cap, %d fetches sent; want 1 and 1 (x's)", s.CapWaiting, tier.fetches.Load())
		}
		close(in)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		tier.pending.Wait()
		checkPerKey(t, sink.outs, map[string]uint64{"x": 1, "h": 1, "y": 1})
		if tier.misses != 2 {
			t.Errorf("%d cold Gets, want 2 (x and y, once each: y's wait for room must not count it twice)", tier.misses)
		}
	})
}

// holdCount counts the values the controller holds in the tier at once.
type holdCount struct {
	*state.Tiered
	held, most int
}

func (h *holdCount) Hold(k state.Key) bool {
	ok := h.Tiered.Hold(k)
	if ok {
		h.held++
		h.most = max(h.most, h.held)
	}
	return ok
}

func (h *holdCount) Release(k state.Key) {
	h.held--
	h.Tiered.Release(k)
}

func (h *holdCount) FillHold(res []state.Fetched, hold []bool) {
	for _, x := range hold {
		if x {
			h.held++
		}
	}
	h.most = max(h.most, h.held)
	h.Tiered.FillHold(res, hold)
}

// TestLargeBatchFilledInParts: a completed batch of many prefetched values is filled and run in
// parts, so what it holds in the tier at once is a part's worth, not the whole batch (which
// would make the tier evict every clean entry it has to make room).
func TestLargeBatchFilledInParts(t *testing.T) {
	m := loadModule(t, "testdata/accumpf.wasm")
	ctx := context.Background()
	const n = 1000
	st, err := state.Open(ctx, "mem://fillparts", state.WithHotBytes(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Every key is durable (a count of 0) and, after a restore, cold.
	w, err := st.Operator(ctx, state.OperatorOptions{Name: "accumpf"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Open(m.Manifest.States); err != nil {
		t.Fatal(err)
	}
	els := make([]Element, n)
	for i := range els {
		k := fmt.Sprintf("k%04d", i)
		w.Put(state.Key{Record: []byte(k)}, binary.LittleEndian.AppendUint64(nil, 0))
		els[i] = rec(k, 0, int64(i), int64(i+1))
	}
	snap, err := w.Capture(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Persist(ctx); err != nil {
		t.Fatal(err)
	}
	w.Close()
	b, err := st.Operator(ctx, state.OperatorOptions{Name: "accumpf", RestoreFrom: state.RestoreLatest})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Open(m.Manifest.States); err != nil {
		t.Fatal(err)
	}
	h := &holdCount{Tiered: b}
	sink := &collectSink{}
	// One Fetch for every record: the batch is sent only when the runner is stuck, with all
	// of them admitted.
	c, err := New(m, h, sink, WithReadBatch(4096, 4096), WithReadBatchWait(time.Hour), WithSpareInstances(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(ctx, feed(els, n)); err != nil {
		t.Fatal(err)
	}
	if s := c.Metrics(); s.ReadBatches != 1 || s.ReadBatchKeys != n {
		t.Fatalf("%d batches of %d keys, want one of %d", s.ReadBatches, s.ReadBatchKeys, n)
	}
	if h.most > fillPartKeys || h.held != 0 {
		t.Errorf("%d values held at once (%d at the end), want at most %d", h.most, h.held, fillPartKeys)
	}
	want := map[string]uint64{}
	for _, e := range els {
		want[string(e.Key)] = 1
	}
	checkPerKey(t, sink.outs, want)
}

// TestCapWaitersBounded: at most capWaitLookahead caps' worth of records wait for room under
// the cap, even with waiting memory to spare, for a module that prefetches (its records of
// cold keys would fetch); then the runner takes no input until they drain. For a module that
// prefetches nothing none waits: the runner reads one input batch ahead and takes nothing
// more at the cap (mayAdmit).
func TestCapWaitersBounded(t *testing.T) {
	for _, module := range []string{"testdata/accum.wasm", "testdata/accumpf.wasm"} {
		t.Run(module, func(t *testing.T) { testCapWaitersBounded(t, module) })
	}
}

func testCapWaitersBounded(t *testing.T, module string) {
	m := loadModule(t, module)
	const inFlight = 2
	synctest.Test(t, func(t *testing.T) {
		tier := newFakeTier(1, 10*time.Millisecond, 10*time.Millisecond, 0)
		sink := &collectSink{}
		c, err := New(m, tier, sink, WithMaxInFlight(inFlight), WithSpareInstances(false))
		if err != nil {
			t.Fatal(err)
		}
		in, done := startRun(c)
		want := map[string]uint64{}
		pos := int64(0)
		send := func(key string, block bool) bool {
			el := rec(key, want[key], pos+1, pos+1)
			if block {
				in <- []Element{el}
			} else if !offer(in, el) {
				return false
			}
			pos++
			want[key]++
			return true
		}
		waiters, readAhead := capWaitLookahead*inFlight, 0
		if module == "testdata/accum.wasm" {
			waiters, readAhead = 0, 1
		}
		for i := range inFlight + waiters + readAhead {
			if !send(fmt.Sprintf("k%d", i), false) {
				t.Fatalf("record %d refused with %d waiting for the cap, below the bound of %d", i, max(i-inFlight, 0), waiters)
			}
		}
		if send("next", false) {
			t.Fatalf("record admitted with %d records waiting for the cap, at the bound", c.Metrics().CapWaiting)
		}
		synctest.Wait()
		// (The prefetching module's first records wait for their fetch, which InFlight (tasks holding
		// an instance) does not count.)
		if s := c.Metrics(); (s.InFlight != inFlight && module == "testdata/accum.wasm") || s.CapWaiting != int64(waiters) {
			t.Errorf("in flight %d, waiting for the cap %d; want %d, %d", s.InFlight, s.CapWaiting, inFlight, waiters)
		}
		for i := range 3 * waiters {
			send(fmt.Sprintf("k%d", i%7), true)
		}
		close(in)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		tier.pending.Wait()
		checkPerKey(t, sink.outs, want)
		if s := c.Metrics(); s.CapWaiting != 0 || s.WaitingBytes != 0 {
			t.Errorf("at the end: waiting for the cap %d (%d B)", s.CapWaiting, s.WaitingBytes)
		}
	})
}

// TestDrainSendsWaitingFetches: once the runner admits nothing more (a barrier drains, or the
// input ended), the records waiting for room under the cap send their fetches at once, in one
// round, instead of a cap's worth per fetch's wait (issue 10: at a tenth hot, 1M records, the
// drains of 12k records waiting for room under a cap of 6,000 took 30-60% of the run). The
// records still come out in per-key order, all before the barrier.
func TestDrainSendsWaitingFetches(t *testing.T) {
	m := loadModule(t, "testdata/accumpf.wasm")
	for _, end := range []string{"barrier", "input"} {
		t.Run(end, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tier := newFakeTier(1, 10*time.Millisecond, 10*time.Millisecond, 0)
				sink := &collectSink{}
				c, err := New(m, tier, sink, WithMaxInFlight(2), WithSpareInstances(false))
				if err != nil {
					t.Fatal(err)
				}
				in, done := startRun(c)
				keys := []string{"a", "b", "c", "d", "e", "f", "g"}
				for i, k := range keys {
					if !offer(in, rec(k, 0, int64(i+1), int64(i+1))) {
						t.Fatalf("record of %s refused", k)
					}
				}
				synctest.Wait()
				if s := c.Metrics(); s.CapWaiting != 5 || tier.fetchKeys.Load() != 2 {
					t.Fatalf("before the drain: %d records waiting for the cap, %d keys fetched; want 5 and 2", s.CapWaiting, tier.fetchKeys.Load())
				}
				if end == "barrier" {
					if !offer(in, Element{Kind: ElementBarrier, CheckID: 1}) {
						t.Fatal("barrier refused")
					}
				} else {
					close(in)
				}
				synctest.Wait() // no fetch has completed: the clock has not moved
				if s := c.Metrics(); s.CapWaiting != 0 || tier.fetchKeys.Load() != int64(len(keys)) {
					t.Errorf("draining: %d records waiting for the cap, %d keys fetched; want 0 and %d (all at once)", s.CapWaiting, tier.fetchKeys.Load(), len(keys))
				}
				if end == "barrier" {
					close(in)
				}
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				tier.pending.Wait()
				want := map[string]uint64{}
				for _, k := range keys {
					want[k] = 1
				}
				checkPerKey(t, sink.outs, want)
				if end == "barrier" {
					if o := sink.outs[len(sink.outs)-1]; o.kind != OutputBarrier {
						t.Errorf("last output %v, want the barrier after every record", o.kind)
					}
				}
			})
		})
	}
}

// TestHotRecordsRunWhileKeysBusy: records of free keys whose prefetched values are hot take the
// all-hits loop (hotRun) while another key waits for its read, not only while every key is free:
// in a cold run some key is nearly always busy, and the general path cost each hit four times
// the runner's CPU (issue 10). A record of the busy key still parks behind it.
func TestHotRecordsRunWhileKeysBusy(t *testing.T) {
	m := loadModule(t, "testdata/accumpf.wasm")
	synctest.Test(t, func(t *testing.T) {
		tier := newFakeTier(1, 10*time.Millisecond, 10*time.Millisecond, 0)
		sink := &collectSink{}
		c, err := New(m, tier, sink, WithSpareInstances(false))
		if err != nil {
			t.Fatal(err)
		}
		const hot = 10
		for i := range hot {
			tier.hot[tier.enc(state.Key{Record: fmt.Appendf(nil, "h%d", i)})] = hotEntry{val: binary.LittleEndian.AppendUint64(nil, 0), found: true}
		}
		in, done := startRun(c)
		want := map[string]uint64{"x": 2}
		els := []Element{rec("x", 0, 1, 1)}
		for i := range hot {
			k := fmt.Sprintf("h%d", i)
			els = append(els, rec(k, 0, int64(i+2), int64(i+2)))
			want[k] = 1
		}
		els = append(els, rec("x", 1, hot+2, hot+2))
		in <- els // one batch: the runner takes the records one after the other, x's read out
		synctest.Wait()
		sink.mu.Lock()
		outs := len(sink.outs)
		sink.mu.Unlock()
		if outs != hot {
			t.Errorf("%d outputs while x's read is out, want the %d hot records'", outs, hot)
		}
		close(in)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		tier.pending.Wait()
		checkPerKey(t, sink.outs, want)
		if c.hotRuns != hot {
			t.Errorf("%d records on the all-hits loop, want the %d hot ones (x's second record parks, then runs hot after its first)", c.hotRuns, hot)
		}
	})
}
