package pipeline

import (
	"context"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/scheduler"
)

func rec(ts int64) scheduler.Element {
	return scheduler.Element{Kind: scheduler.ElementRecord, TS: ts, Value: []byte("{}")}
}
func wm(ts int64) scheduler.Element {
	return scheduler.Element{Kind: scheduler.ElementWatermark, TS: ts}
}
func bar(id uint64) scheduler.Element {
	return scheduler.Element{Kind: scheduler.ElementBarrier, CheckID: id}
}

// next receives the merger's next element, failing after a while.
func next(t *testing.T, m *merger, buf *[]scheduler.Element) (scheduler.Element, bool) {
	t.Helper()
	for len(*buf) == 0 {
		select {
		case b, ok := <-m.out:
			if !ok {
				return scheduler.Element{}, false
			}
			*buf = b
		case <-time.After(5 * time.Second):
			t.Fatal("the merger is stuck")
		}
	}
	el := (*buf)[0]
	*buf = (*buf)[1:]
	return el, true
}

// nothing checks that the merger has nothing more to give right now.
func nothing(t *testing.T, m *merger, buf []scheduler.Element) {
	t.Helper()
	if len(buf) > 0 {
		t.Fatalf("unexpected %+v", buf[0])
	}
	select {
	case b := <-m.out:
		t.Fatalf("unexpected %+v", b)
	case <-time.After(20 * time.Millisecond):
	}
}

// TestMergerAlignment: an input that delivered barrier n is held until every open input has
// delivered it; the barrier goes out once, after everything before it on every input; the
// watermark is the minimum over open inputs; a closed input stops holding either back; records
// at or before the forwarded watermark are late.
func TestMergerAlignment(t *testing.T) {
	a, b := newChannel("a", "x"), newChannel("b", "x")
	m := newMerger([]*channel{a, b})
	m.checkLate = true
	var late []int64
	m.late = func(el *scheduler.Element) error { late = append(late, el.TS); return nil }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.run(ctx) }()
	var buf []scheduler.Element

	a.deliver([]scheduler.Element{rec(10), wm(100), bar(1), rec(200)})
	if el, _ := next(t, m, &buf); el.TS != 10 {
		t.Fatalf("got %+v", el)
	}
	// a's watermark 100 waits for b's; a's record after the barrier is held.
	nothing(t, m, buf)
	b.deliver([]scheduler.Element{rec(20), wm(50)})
	if el, _ := next(t, m, &buf); el.TS != 20 {
		t.Fatalf("got %+v", el)
	}
	if el, _ := next(t, m, &buf); el.Kind != scheduler.ElementWatermark || el.TS != 50 {
		t.Fatalf("want watermark 50, got %+v", el)
	}
	nothing(t, m, buf)
	b.deliver([]scheduler.Element{rec(40), rec(60), bar(1)}) // 40 is late (≤ 50)
	if el, _ := next(t, m, &buf); el.TS != 60 {
		t.Fatalf("got %+v", el)
	}
	if el, _ := next(t, m, &buf); el.Kind != scheduler.ElementBarrier || el.CheckID != 1 {
		t.Fatalf("want barrier 1, got %+v", el)
	}
	if el, _ := next(t, m, &buf); el.TS != 200 { // released
		t.Fatalf("got %+v", el)
	}
	if len(late) != 1 || late[0] != 40 {
		t.Fatalf("late %v", late)
	}
	// b closes: the watermark follows a alone.
	b.closeSignal()
	if el, _ := next(t, m, &buf); el.Kind != scheduler.ElementWatermark || el.TS != 100 {
		t.Fatalf("want watermark 100, got %+v", el)
	}
	a.deliver([]scheduler.Element{bar(2), wm(math.MaxInt64)})
	if el, _ := next(t, m, &buf); el.Kind != scheduler.ElementBarrier || el.CheckID != 2 {
		t.Fatalf("a barrier with one open input: %+v", el)
	}
	if el, _ := next(t, m, &buf); el.TS != math.MaxInt64 {
		t.Fatalf("got %+v", el)
	}
	a.closeSignal()
	if _, ok := next(t, m, &buf); ok {
		t.Fatal("the merger did not close after its inputs")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestMergerCancel: a cancelled merger returns, even with an input blocked on a barrier.
func TestMergerCancel(t *testing.T) {
	a, b := newChannel("a", "x"), newChannel("b", "x")
	m := newMerger([]*channel{a, b})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.run(ctx) }()
	a.deliver([]scheduler.Element{bar(1), rec(1)})
	time.Sleep(10 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("no error from a cancelled merger")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the merger did not stop")
	}
}

// TestMergerPassThrough: a subtask with one input and nothing late to find reads its channel
// itself (no merger goroutine); with several inputs, or one whose records can be late (event
// time and late detection on), or a recording that taps the merger, the merger runs.
func TestMergerPassThrough(t *testing.T) {
	for _, tc := range []struct {
		name                         string
		inputs                       int
		checkLate, eventTime, tapped bool
		pass                         bool
	}{
		{"one input, no event time", 1, true, false, false, true},
		{"one input, event time, no late check (sink, flag form)", 1, false, true, false, true},
		{"one input, event time, late check", 1, true, true, false, false},
		{"two inputs", 2, true, false, false, false},
		{"recorded", 1, false, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ins []*channel
			for range tc.inputs {
				ins = append(ins, newChannel("a", "x"))
			}
			m := newMerger(ins)
			m.checkLate, m.eventTime, m.tapped = tc.checkLate, tc.eventTime, tc.tapped
			in, cancel, wait := m.start(context.Background())
			defer cancel()
			if got := in == (<-chan []scheduler.Element)(ins[0].ch); got != tc.pass {
				t.Fatalf("input is the channel itself: %v, want %v", got, tc.pass)
			}
			// Either way the records and the barrier arrive, in order, and the end closes it.
			ins[0].deliver([]scheduler.Element{rec(1), bar(1), rec(2)})
			for _, c := range ins {
				c.closeSignal()
			}
			var got []scheduler.Element
			for b := range in {
				got = append(got, b...)
			}
			if len(got) != 3 || got[0].TS != 1 || got[1].Kind != scheduler.ElementBarrier || got[2].TS != 2 {
				t.Fatalf("got %+v", got)
			}
			if err := wait(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// deliver sends b on c as a sender does: the batch, then the merger's token.
func (c *channel) deliver(b []scheduler.Element) {
	c.ch <- b
	c.signal()
}

// TestMergerOneGoroutine: a merger of many inputs is one goroutine (it waits on the inputs'
// shared token, not with a reader per input), and it still takes each input's batches.
func TestMergerOneGoroutine(t *testing.T) {
	const n = 16
	var ins []*channel
	for range n {
		ins = append(ins, newChannel("a", "x"))
	}
	m := newMerger(ins)
	before := runtime.NumGoroutine()
	in, cancel, wait := m.start(context.Background())
	defer cancel()
	if d := runtime.NumGoroutine() - before; d != 1 {
		t.Fatalf("the merger of %d inputs started %d goroutines, want 1", n, d)
	}
	for i, c := range ins {
		c.deliver([]scheduler.Element{rec(int64(i))})
		c.closeSignal()
	}
	seen := map[int64]bool{}
	for b := range in {
		for _, el := range b {
			seen[el.TS] = true
		}
	}
	if len(seen) != n {
		t.Fatalf("records of %d inputs of %d", len(seen), n)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}
