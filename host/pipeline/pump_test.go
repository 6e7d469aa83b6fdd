package pipeline

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pushSource is an unbounded source whose records a test appends (push), read through a
// PumpedReader: the test's goroutine is the writer that pumps.
type pushSource struct {
	mu     sync.Mutex
	recs   []SourceRecord
	reader *pushReader
	avail  chan struct{} // a token after a push the pump did not take (the goroutine's wake)
	// gate, once set, keeps the subtask's goroutine at the end of its Wait (out of its turns)
	// until it is closed; atGate gets a token as the goroutine arrives there.
	gate   atomic.Pointer[chan struct{}]
	atGate chan struct{}
}

func newPushSource() *pushSource { return &pushSource{avail: make(chan struct{}, 1)} }

// current is the reader opened last (nil before).
func (s *pushSource) current() *pushReader {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reader
}

func (s *pushSource) Splits(context.Context) ([]string, error) { return []string{"push"}, nil }
func (s *pushSource) Bounded() bool                            { return false }
func (s *pushSource) Open(_ context.Context, sp []Split) (SourceReader, error) {
	r := &pushReader{s: s}
	if len(sp) == 1 && sp[0].Position != nil {
		n, _ := strconv.Atoi(string(sp[0].Position))
		r.next = n
	}
	s.mu.Lock()
	s.reader = r
	s.mu.Unlock()
	return r, nil
}

// push appends recs and pumps them as a writer would (ingest.Log.Append): it reports whether
// the pump routed them, and wakes the subtask's goroutine when it did not.
func (s *pushSource) push(recs ...SourceRecord) bool {
	s.mu.Lock()
	s.recs = append(s.recs, recs...)
	r := s.reader
	s.mu.Unlock()
	var took bool
	if pump := r.pumpFn(); pump != nil {
		r.pumping.Store(true)
		took = pump()
		r.pumping.Store(false)
	}
	if !took {
		select {
		case s.avail <- struct{}{}:
		default:
		}
	}
	return took
}

type pushReader struct {
	s       *pushSource
	next    int // the subtask's (under its lock)
	pump    atomic.Pointer[func() bool]
	pumping atomic.Bool  // the test's goroutine is in a pump
	pumped  atomic.Int64 // records read in pumps
	direct  atomic.Int64 // records read by the subtask's goroutine
}

func (r *pushReader) pumpFn() func() bool {
	if p := r.pump.Load(); p != nil {
		return *p
	}
	return nil
}

func (r *pushReader) SetPump(pump func() bool) {
	if pump == nil {
		r.pump.Store(nil)
		return
	}
	r.pump.Store(&pump)
}

func (r *pushReader) Wait(ctx context.Context, wake <-chan struct{}) {
	t := time.NewTimer(20 * time.Millisecond)
	defer t.Stop()
	select {
	case <-r.s.avail:
	case <-wake:
	case <-t.C:
	case <-ctx.Done():
	}
	if g := r.s.gate.Load(); g != nil {
		select {
		case r.s.atGate <- struct{}{}:
		default:
		}
		<-*g
	}
}

func (r *pushReader) Read(_ context.Context, buf []SourceRecord) (int, error) {
	if r.pumpFn() == nil {
		return 0, errors.New("pushReader: read without a pump set (it would have to block)")
	}
	r.s.mu.Lock()
	n := copy(buf, r.s.recs[r.next:])
	r.s.mu.Unlock()
	r.next += n
	if r.pumping.Load() {
		r.pumped.Add(int64(n))
	} else {
		r.direct.Add(int64(n))
	}
	return n, nil
}

func (r *pushReader) Positions() []Split {
	return []Split{{ID: "push", Position: []byte(strconv.Itoa(r.next))}}
}
func (r *pushReader) Close() error { return nil }

// startPushJob runs push → fast (keyed by the source's key) → a memory sink, with checkpoints
// every 5 ms, and waits until the source is open.
func startPushJob(t *testing.T, src *pushSource, onMalformed string) (*Job, *memSink) {
	t.Helper()
	return startPushJobSink(t, src, onMalformed, "checkpoints: {interval: 5ms}", &memSink{})
}

func startPushJobSink(t *testing.T, src *pushSource, onMalformed, checkpoints string, out Sink) (*Job, *memSink) {
	t.Helper()
	mod, err := filepath.Abs("../abi/testdata/fast.wasm")
	if err != nil {
		t.Fatal(err)
	}
	conns := &Connectors{}
	conns.RegisterSource("push", func(*SourceSpec, *ConnectorOptions, *Env) (Source, error) { return src, nil })
	conns.RegisterSink("out", func(*SinkSpec, *ConnectorOptions, *Env) (Sink, error) { return out, nil })
	spec, err := ParseSpec(fmt.Appendf(nil, `
name: pump
%s
sources: [{name: in, type: push, on_malformed: %s}]
operators: [{name: fast, module: %s, inputs: [in], key: {source: true}}]
sinks: [{name: out, type: out, inputs: [fast]}]
`, checkpoints, onMalformed, mod))
	if err != nil {
		t.Fatal(err)
	}
	j, err := Start(context.Background(), spec, Env{Connectors: conns, StateURL: newMemPool(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Stop(context.Background(), false) })
	for i := 0; src.current() == nil || src.current().pumpFn() == nil; i++ { // SetPump: once the subtask runs
		if i > 5000 {
			t.Fatal("the source subtask never set its pump")
		}
		time.Sleep(time.Millisecond)
	}
	ms, _ := out.(*memSink)
	return j, ms
}

func (s *memSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recs)
}

// waitCount waits until out has n records (the subtask's goroutine wakes every 20 ms at most,
// so a record left to it arrives within that).
func waitCount(t *testing.T, j *Job, out *memSink, n int) {
	t.Helper()
	for i := 0; out.count() < n; i++ {
		if i > 10000 {
			t.Fatalf("the sink has %d of %d records; job %v", out.count(), n, j.Metrics().State)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPumpedSource: a PumpedReader's writer routes the records it appended in its own
// goroutine (the pump), and what the pump cannot route simply, a malformed record here, the
// subtask's goroutine routes. Every record arrives once, in order per key, while checkpoints
// run every 5 ms, and the final savepoint's position counts exactly the records the sink has.
func TestPumpedSource(t *testing.T) {
	src := newPushSource()
	j, out := startPushJob(t, src, "skip")
	const batches, per = 60, 20
	took, pos := 0, 0
	for b := range batches {
		var recs []SourceRecord
		for i := range per {
			recs = append(recs, SourceRecord{Key: fmt.Appendf(nil, "k%d", i%3), Value: []byte("c"), Pos: int64(pos)})
			pos++
		}
		malformed := b%10 == 9
		if malformed {
			recs[per/2].Malformed = errors.New("a bad record")
		}
		ok := src.push(recs...)
		if ok && malformed {
			t.Fatalf("batch %d: the pump routed a batch holding a malformed record", b)
		}
		if ok {
			took++
		}
		// A closed loop, as the ingest API's clients: the next batch once this one is out,
		// so that the channels have room for the next pump.
		waitCount(t, j, out, (b+1)*per-(b+1)/10)
	}
	want := batches*per - batches/10
	// The subtask's goroutine turns only every 20 ms when idle, checkpoints every 5 ms: the
	// pump can find it in a turn of its own, but not for most batches.
	if took < batches/2 {
		t.Fatalf("the pump routed %d of %d batches", took, batches)
	}
	r := src.current()
	if r.pumped.Load() == 0 || r.pumped.Load()+r.direct.Load() != batches*per {
		t.Fatalf("%d records read in pumps, %d by the subtask's goroutine, want %d in all", r.pumped.Load(), r.direct.Load(), batches*per)
	}
	if _, err := j.Stop(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Wait(); err != nil {
		t.Fatal(err)
	}
	if m := j.Metrics(); m.Sources[0].Skipped != batches/10 {
		t.Fatalf("%d records skipped, want %d", m.Sources[0].Skipped, batches/10)
	}
	last := map[string]int64{}
	for _, rec := range out.recs {
		k := string(rec.Key)
		if p, ok := last[k]; ok && rec.Pos <= p {
			t.Fatalf("key %s: position %d after %d", k, rec.Pos, p)
		}
		last[k] = rec.Pos
	}
	if len(out.recs) != want {
		t.Fatalf("the sink has %d records, want %d", len(out.recs), want)
	}
	cp, err := j.latest(context.Background())
	if err != nil || cp == nil {
		t.Fatalf("no savepoint: %v", err)
	}
	if got := string(cp.Sources["in"].Splits[0].Position); got != strconv.Itoa(batches*per) {
		t.Fatalf("the savepoint's position is %s, want %d", got, batches*per)
	}
}

// TestPumpedSourceConcurrent: writers pumping from several goroutines at once, without
// waiting for their records, while checkpoints run: the pumps, the subtask's goroutine and the
// barriers take turns under the subtask's lock, and a full channel makes a pump refuse
// (never block), so every record arrives once and the savepoint covers them all.
func TestPumpedSourceConcurrent(t *testing.T) {
	src := newPushSource()
	j, out := startPushJob(t, src, "fail")
	const writers, batches, per = 4, 50, 30
	var wg sync.WaitGroup
	var seq atomic.Int64
	for w := range writers {
		wg.Go(func() {
			for range batches {
				var recs []SourceRecord
				for i := range per {
					recs = append(recs, SourceRecord{Key: fmt.Appendf(nil, "w%d-%d", w, i%4), Value: []byte("c"), Pos: seq.Add(1)})
				}
				src.push(recs...)
			}
		})
	}
	wg.Wait()
	waitCount(t, j, out, writers*batches*per)
	if _, err := j.Stop(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Wait(); err != nil {
		t.Fatal(err)
	}
	if len(out.recs) != writers*batches*per {
		t.Fatalf("the sink has %d records, want %d", len(out.recs), writers*batches*per)
	}
	cp, err := j.latest(context.Background())
	if err != nil || cp == nil {
		t.Fatalf("no savepoint: %v", err)
	}
	if got := string(cp.Sources["in"].Splits[0].Position); got != strconv.Itoa(writers*batches*per) {
		t.Fatalf("the savepoint's position is %s, want %d", got, writers*batches*per)
	}
}

// TestRouterRoom: a router has room for n batches only while every channel of every edge has
// n free slots, and never with a chained sink on an edge.
func TestRouterRoom(t *testing.T) {
	a, b := newChannel("s", "a"), newChannel("s", "b")
	r := &router{main: []*edgeOut{newEdgeOut(false, nil, []*channel{a, b}, 2, 8)}}
	if !r.room(channelBatches) {
		t.Fatal("empty channels: no room")
	}
	for range channelBatches - 1 {
		b.ch <- nil
	}
	if !r.room(1) || r.room(2) {
		t.Fatalf("one free slot in b: room(1) %v, room(2) %v", r.room(1), r.room(2))
	}
	b.ch <- nil
	if r.room(1) {
		t.Fatal("a full channel: room(1)")
	}
	r2 := &router{main: []*edgeOut{{sink: &chainedSink{}}}}
	if r2.room(1) {
		t.Fatal("a chained sink: room(1)")
	}
}

// preCommitSink counts the records written and, at each pre-commit, how many came before it.
type preCommitSink struct {
	mu     sync.Mutex
	n      int
	before map[uint64]int
}

func (s *preCommitSink) Committer() SinkCommitter                              { return nil }
func (s *preCommitSink) Open(context.Context, SinkContext) (SinkWriter, error) { return s, nil }
func (s *preCommitSink) Write(_ context.Context, recs []SinkRecord) error {
	s.mu.Lock()
	s.n += len(recs)
	s.mu.Unlock()
	return nil
}
func (s *preCommitSink) PreCommit(_ context.Context, id uint64) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.before[id] = s.n
	return nil, nil
}
func (s *preCommitSink) Close(context.Context) error { return nil }

// TestPumpedSourcePendingBeforeBarrier: a read a pump left for the subtask's goroutine (it
// held a malformed record) is routed before a barrier that was already waiting: the reader's
// positions count its records, so the barrier must come after them. The goroutine is held out
// of its turns (the reader's gate) while the pump leaves the read and the savepoint's trigger
// arrives.
func TestPumpedSourcePendingBeforeBarrier(t *testing.T) {
	src := newPushSource()
	src.atGate = make(chan struct{}, 1)
	sink := &preCommitSink{before: map[uint64]int{}}
	j, _ := startPushJobSink(t, src, "skip", "", sink)
	j.mu.Lock()
	task := j.cur.srcTasks[0]
	j.mu.Unlock()
	gate := make(chan struct{})
	src.gate.Store(&gate)
	<-src.atGate // the goroutine is at the gate: no turn of its own until it opens
	var recs []SourceRecord
	for i := range 10 {
		recs = append(recs, SourceRecord{Key: []byte("k"), Value: []byte("c"), Pos: int64(i)})
	}
	recs[4].Malformed = errors.New("a bad record")
	if src.push(recs...) {
		t.Fatal("the pump routed a read holding a malformed record")
	}
	type result struct {
		id  uint64
		err error
	}
	done := make(chan result, 1)
	go func() {
		id, err := j.Savepoint(context.Background())
		done <- result{id, err}
	}()
	for i := 0; len(task.trig) == 0; i++ { // the savepoint's trigger waits at the source
		if i > 10000 {
			t.Fatal("no trigger reached the source")
		}
		time.Sleep(time.Millisecond)
	}
	close(gate)
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	cp, err := j.latest(context.Background())
	if err != nil || cp == nil || cp.ID != res.id {
		t.Fatalf("no savepoint %d: %v", res.id, err)
	}
	sink.mu.Lock()
	before := sink.before[res.id]
	sink.mu.Unlock()
	if pos := string(cp.Sources["in"].Splits[0].Position); pos != "10" || before != 9 {
		t.Fatalf("the savepoint covers position %s with %d records written before it, want 10 and 9", pos, before)
	}
}
