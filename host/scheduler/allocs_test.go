package scheduler

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/state"
)

// quietTier is a state.Backend that allocates nothing itself, so that what a run allocates per
// record is the controller's: every record's read of its count is cold (a Put makes the key
// cold again), Fetch answers at once from the tier's own arrays, and Fill makes the key hot for
// the call that waits for it. The WAT counter then suspends inside every call.
type quietTier struct {
	keys    map[string]*quietEntry
	results [][]state.Fetched // a ring: a batch's results are used until it is delivered
	next    int
	fetches int
}

type quietEntry struct {
	v   [8]byte
	n   int
	hot bool
}

func newQuietTier(keys []string, batches, batchCap int) *quietTier {
	q := &quietTier{keys: make(map[string]*quietEntry, len(keys)), results: make([][]state.Fetched, batches)}
	for _, k := range keys {
		q.keys[k] = &quietEntry{}
	}
	for i := range q.results {
		q.results[i] = make([]state.Fetched, 0, batchCap)
	}
	return q
}

func (q *quietTier) entry(k state.Key) *quietEntry {
	e := q.keys[string(k.Record)]
	if e == nil || k.State != 0 || len(k.Entry) != 0 {
		panic(fmt.Sprintf("quietTier: unexpected key %v", k))
	}
	return e
}

func (q *quietTier) Open([]string) error { return nil }

func (q *quietTier) Get(k state.Key) ([]byte, bool, bool) {
	e := q.entry(k)
	return e.v[:e.n], e.n > 0, e.hot
}

func (q *quietTier) Put(k state.Key, v []byte) {
	e := q.entry(k)
	e.n = copy(e.v[:], v)
	e.hot = false // the next record of the key reads it cold again
}

func (q *quietTier) Delete(k state.Key) { q.entry(k).n, q.entry(k).hot = 0, false }

func (q *quietTier) Fetch(keys []state.Key, done func([]state.Fetched, error)) {
	q.fetches++
	res := q.results[q.next][:0]
	q.next = (q.next + 1) % len(q.results)
	for _, k := range keys {
		e := q.entry(k)
		res = append(res, state.Fetched{Key: k, Value: e.v[:e.n], Found: e.n > 0})
	}
	done(res, nil)
}

func (q *quietTier) Fill(res []state.Fetched) {
	for _, r := range res {
		q.entry(r.Key).hot = true
	}
}

func (q *quietTier) SetOperatorState(string, []byte)        {}
func (q *quietTier) OperatorState(string) []byte            { return nil }
func (q *quietTier) Capture(uint64) (state.Snapshot, error) { return nilSnapshot{}, nil }
func (q *quietTier) Close() error                           { return nil }

// TestSuspensionAllocatesNothing: in the steady state a record whose call suspends on a cold
// read, in a coroutine or on a carrier, costs the controller no allocation: not its read's
// batch, the batch's keys or its completion, nor a place in the ready or runnable queues. (Each
// allocation per record was a share of the suspension path's CPU in collector work, issue 11.)
// The runs' fixed costs (instances, coroutines, carriers, pools filling up) are the same for a
// short and a long run, so the difference between them is what the extra records cost.
func TestSuspensionAllocatesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a few thousand records")
	}
	m := loadModule(t, "../abi/testdata/counter.wasm")
	const nkeys, inFlight = 64, 16
	names := make([]string, nkeys)
	for i := range names {
		names[i] = fmt.Sprintf("key-%02d", i)
	}
	records := func(n int) []Element {
		els := make([]Element, n)
		for i := range els {
			// Keys in turns of a busy key's records: some park behind their key, most run.
			k := names[(i*7+i/nkeys)%nkeys]
			els[i] = Element{Kind: ElementRecord, Key: []byte(k), Value: []byte(`{"v":1}`), TS: int64(i), Pos: int64(i + 1)}
		}
		return els
	}
	for _, mode := range []struct {
		name string
		mode ExecMode
	}{{"coroutine", ExecCoroutine}, {"carrier", ExecDirect}} {
		t.Run(mode.name, func(t *testing.T) {
			run := func(els []Element) *quietTier {
				tier := newQuietTier(names, 4*inFlight, 64)
				c, err := New(m, tier, &discardSink{}, WithMaxInFlight(inFlight), WithExecMode(mode.mode),
					WithSpareInstances(false))
				if err != nil {
					t.Fatal(err)
				}
				ch := make(chan []Element, len(els)/256+2)
				for i := 0; i < len(els); i += 256 {
					ch <- els[i:min(i+256, len(els))]
				}
				close(ch)
				if err := c.Run(context.Background(), ch); err != nil {
					t.Fatal(err)
				}
				if s := c.Metrics(); s.Suspensions != int64(len(els)) {
					t.Fatalf("%d suspensions for %d records: the test wants every call to suspend", s.Suspensions, len(els))
				}
				return tier
			}
			short, long := records(2_000), records(10_000)
			run(long) // the module's compiled code, wazero's caches
			a := testing.AllocsPerRun(3, func() { run(short) })
			b := testing.AllocsPerRun(3, func() { run(long) })
			perRecord := (b - a) / float64(len(long)-len(short))
			t.Logf("%.0f allocations for %d records, %.0f for %d: %.4f a record", a, len(short), b, len(long), perRecord)
			// A run's fixed costs vary (how many carriers it spawned, a GC's timing): by a few
			// tens of allocations on a quiet machine, by ~500 under -race on a loaded one (0.06
			// a record seen once). The bound allows for that, not for a per-record cost: before
			// the pooled batches and queues it was 0.5 a record.
			if perRecord > 0.15 {
				t.Errorf("%.4f allocations per suspended record, want none", perRecord)
			}
		})
	}
}

// TestTaskQueue checks the ready and runnable queues against a slice: FIFO order through
// pops, pushes that compact the array and bulk pushes, and no growth of the array while the
// queue's length stays bounded.
func TestTaskQueue(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	tasks := make([]*task, 64)
	for i := range tasks {
		tasks[i] = &task{seq: uint64(i)}
	}
	var q taskQueue
	var model []*task
	for step := range 20_000 {
		switch r := rng.IntN(10); {
		case r < 4 && len(model) < 48:
			x := tasks[rng.IntN(len(tasks))]
			q.push(x)
			model = append(model, x)
		case r < 5 && len(model) < 40:
			xs := tasks[:rng.IntN(8)]
			q.pushAll(xs)
			model = append(model, xs...)
		case r < 9 && len(model) > 0:
			if got := q.pop(); got != model[0] {
				t.Fatalf("step %d: popped task %d, want %d", step, got.seq, model[0].seq)
			}
			model = model[1:]
		}
		if q.len() != len(model) {
			t.Fatalf("step %d: len %d, want %d", step, q.len(), len(model))
		}
		for i, x := range q.live() {
			if x != model[i] {
				t.Fatalf("step %d: live()[%d] is task %d, want %d", step, i, x.seq, model[i].seq)
			}
		}
		for _, x := range q.q[:q.head] {
			if x != nil {
				t.Fatalf("step %d: a popped slot still holds task %d", step, x.seq)
			}
		}
	}
	// Never more than 48 queued: the array stays within what 48 + a bulk push needs.
	if cap(q.q) > 128 {
		t.Errorf("the array grew to %d for at most 48 queued tasks", cap(q.q))
	}
	n := testing.AllocsPerRun(100, func() {
		for range 200 {
			q.push(tasks[0])
			q.push(tasks[1])
			q.pop()
		}
		for q.len() > 0 {
			q.pop()
		}
	})
	if n != 0 {
		t.Errorf("%v allocations per push/pop cycle, want 0", n)
	}
}
