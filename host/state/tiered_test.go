package state

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clink-wasm/clink-wasm/host/state/internal/format"
)

var testNames = []string{"count", "sum", "seen"}

func openTest(t testing.TB, url string, opts ...Option) *Store {
	t.Helper()
	s, err := Open(context.Background(), url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func operator(t testing.TB, s *Store, o OperatorOptions) *Tiered {
	t.Helper()
	if o.Name == "" {
		o.Name = "op"
	}
	b, err := s.Operator(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Open(testNames); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func key(state int, rec, ent string) Key {
	return Key{State: StateID(state), Record: []byte(rec), Entry: []byte(ent)}
}

func fetchSync(t testing.TB, b Backend, keys []Key) ([]Fetched, error) {
	t.Helper()
	type res struct {
		f   []Fetched
		err error
	}
	ch := make(chan res, 1)
	b.Fetch(keys, func(f []Fetched, err error) { ch <- res{f, err} })
	select {
	case r := <-ch:
		return r.f, r.err
	case <-time.After(60 * time.Second):
		t.Fatal("fetch timed out")
		return nil, nil
	}
}

// read returns k's value, fetching and filling it when cold.
func read(t testing.TB, b Backend, k Key) ([]byte, bool) {
	t.Helper()
	v, ok, hot := b.Get(k)
	if hot {
		return append([]byte(nil), v...), ok
	}
	f, err := fetchSync(t, b, []Key{k})
	if err != nil {
		t.Fatalf("fetch %q: %v", k.Record, err)
	}
	b.Fill(f)
	return f[0].Value, f[0].Found
}

func checkpoint(t testing.TB, b Backend, id uint64) {
	t.Helper()
	snap, err := b.Capture(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Persist(context.Background()); err != nil {
		t.Fatalf("persist %d: %v", id, err)
	}
}

func TestRoundTripRestore(t *testing.T) {
	for _, url := range []string{"mem://roundtrip", "file://" + t.TempDir()} {
		t.Run(strings.SplitN(url, ":", 2)[0], func(t *testing.T) {
			s := openTest(t, url, WithFsync(false))
			b := operator(t, s, OperatorOptions{})
			for i := range 1000 {
				b.Put(key(i%3, fmt.Sprint("r", i), "e"), []byte(fmt.Sprint("v", i)))
			}
			b.Delete(key(0, "r0", "e"))
			b.SetOperatorState("timers", []byte("T1"))
			checkpoint(t, b, 1)
			b.Put(key(1, "r1", "e"), []byte("new"))
			b.Delete(key(2, "r2", "e"))
			checkpoint(t, b, 2)
			b.Close()
			s.Close()

			s2 := openTest(t, url, WithFsync(false))
			r := operator(t, s2, OperatorOptions{RestoreFrom: RestoreLatest})
			if got := string(r.OperatorState("timers")); got != "T1" {
				t.Fatalf("operator state %q", got)
			}
			for i := range 1000 {
				v, ok := read(t, r, key(i%3, fmt.Sprint("r", i), "e"))
				want, wantOK := fmt.Sprint("v", i), true
				switch i {
				case 0, 2:
					wantOK = false
				case 1:
					want = "new"
				}
				if ok != wantOK || ok && string(v) != want {
					t.Fatalf("key %d: got %q,%v want %q,%v", i, v, ok, want, wantOK)
				}
			}
			// Restoring the older checkpoint sees the older values.
			r1 := operator(t, s2, OperatorOptions{Name: "op", RestoreFrom: 1, KeyGroups: KeyGroupRange{Lo: 0, Hi: 128}})
			if v, _ := read(t, r1, key(1, "r1", "e")); string(v) != "v1" {
				t.Fatalf("checkpoint 1 value %q", v)
			}
		})
	}
}

func TestEvictionAndColdRead(t *testing.T) {
	s := openTest(t, "mem://", WithHotBytes(8<<10))
	b := operator(t, s, OperatorOptions{})
	val := bytes.Repeat([]byte("x"), 100)
	for i := range 2000 {
		b.Put(key(0, fmt.Sprint("k", i), ""), val)
	}
	// Dirty keys cannot be evicted: at a third of the budget they spill, so the entries stay in
	// it. (The 142 spills' indexes and filters, counted in the tier too, outgrow this tiny
	// budget on their own: then they are all it holds above it.)
	m := b.Metrics()
	if m.HotBytes-m.IndexBytes > 8<<10+2*int64(100+entryOverhead+8) || m.HotOverflow > m.IndexBytes || m.IndexBytes == 0 || m.Spills == 0 {
		t.Fatalf("dirty keys must spill within the budget: %+v", m)
	}
	checkpoint(t, b, 1)
	b.Get(key(0, "k0", "")) // observes the commit and evicts
	m = b.Metrics()
	if m.HotBytes-m.IndexBytes > 8<<10+int64(100+entryOverhead+8) || m.Evictions == 0 {
		t.Fatalf("after commit: %+v", m)
	}
	var cold []Key
	for i := range 2000 {
		k := key(0, fmt.Sprint("k", i), "")
		if _, _, hot := b.Get(k); !hot {
			cold = append(cold, k)
		}
	}
	if len(cold) < 1500 {
		t.Fatalf("only %d cold keys", len(cold))
	}
	f, err := fetchSync(t, b, cold)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range f {
		if !r.Found || !bytes.Equal(r.Value, val) || !bytes.Equal(r.Key.Record, cold[i].Record) {
			t.Fatalf("fetched %d: %+v", i, r)
		}
	}
	m = b.Metrics()
	if per := float64(m.FetchKeys) / float64(m.FetchBlocks); per < 10 {
		t.Fatalf("%.1f keys per block read: %+v", per, m)
	}
	// A backend's metrics count its pool's requests: the blocks just read, the segments and
	// manifest written.
	if m.RemoteGets < m.FetchBlocks || m.RemoteGetBytes == 0 || m.RemotePuts == 0 || m.RemotePutBytes == 0 {
		t.Fatalf("remote requests not counted: %+v", m)
	}
	if want := float64(m.Hits) / float64(m.Hits+m.Misses); m.Misses == 0 || m.HitRatio != want {
		t.Fatalf("hit ratio %v, want %v", m.HitRatio, want)
	}
	// A never-written key is known absent without a fetch once indexes are loaded, unless a
	// segment's filter has a false positive for it (about 1% per segment: with the many small
	// spill segments of this tiny budget, most absent keys meet one).
	known := 0
	for i := range 200 {
		if _, ok, hot := b.Get(key(0, fmt.Sprint("nope", i), "")); ok {
			t.Fatalf("absent key %d found", i)
		} else if hot {
			known++
		}
	}
	m = b.Metrics()
	if want := 200 * math.Pow(0.99, float64(m.Segments)) / 2; float64(known) < max(want, 1) {
		t.Fatalf("%d of 200 absent keys known absent over %d segments, want >= %.0f", known, m.Segments, want)
	}
}

func TestFillLocalWriteWins(t *testing.T) {
	s := openTest(t, "mem://")
	b := operator(t, s, OperatorOptions{HotBytes: 1})
	b.Put(key(0, "a", ""), []byte("old"))
	checkpoint(t, b, 1)
	b.Get(key(1, "zz", "")) // evict
	if _, _, hot := b.Get(key(0, "a", "")); hot {
		t.Fatal("expected cold")
	}
	f, err := fetchSync(t, b, []Key{key(0, "a", "")})
	if err != nil || string(f[0].Value) != "old" {
		t.Fatal(err, f)
	}
	b.Put(key(0, "a", ""), []byte("new"))
	b.Fill(f)
	// read, not Get: under this budget the write spills at once, and once the spill is
	// written (sooner under -race) the entry may be evicted, so that the value is cold.
	if v, _ := read(t, b, key(0, "a", "")); string(v) != "new" {
		t.Fatalf("fill overwrote a local write: %q", v)
	}
	// A write committed and evicted after the fetch was issued also wins.
	b.Put(key(0, "b", ""), []byte("b1"))
	checkpoint(t, b, 2)
	b.Get(key(1, "zz", ""))
	f, _ = fetchSync(t, b, []Key{key(0, "b", "")})
	f[0].Value = []byte("stale") // pretend it read an old version
	b.Put(key(0, "b", ""), []byte("b2"))
	checkpoint(t, b, 3)
	b.Get(key(1, "zz", "")) // evicts b
	b.Fill(f)
	if v, _ := read(t, b, key(0, "b", "")); string(v) != "b2" {
		t.Fatalf("stale fill served: %q", v)
	}
}

func TestRescaleRestore(t *testing.T) {
	s := openTest(t, "mem://rescale")
	const n = 3000
	model := map[string]string{}
	var olds []*Tiered
	for i := range 2 {
		olds = append(olds, operator(t, s, OperatorOptions{Name: "agg", KeyGroups: KeyGroupRangeFor(i, 2, 128)}))
	}
	route := func(rec string, p int, bs []*Tiered) *Tiered {
		kg := KeyGroupOf([]byte(rec), 128)
		for _, b := range bs {
			if b.KeyGroups().Contains(kg) {
				return b
			}
		}
		t.Fatalf("no owner for %d of %d", kg, p)
		return nil
	}
	for i := range n {
		rec := fmt.Sprint("user", i)
		route(rec, 2, olds).Put(key(1, rec, "x"), []byte(rec))
		model[rec] = rec
	}
	for _, b := range olds {
		b.SetOperatorState("timers", []byte(b.KeyGroups().String()))
		checkpoint(t, b, 7)
	}
	complete, _, err := s.Checkpoints(context.Background(), "", "agg", 0)
	if err != nil || len(complete) != 1 || complete[0] != 7 {
		t.Fatal(complete, err)
	}
	var news []*Tiered
	for i := range 3 {
		b := operator(t, s, OperatorOptions{Name: "agg", KeyGroups: KeyGroupRangeFor(i, 3, 128), RestoreFrom: 7})
		news = append(news, b)
	}
	if got := len(news[1].RestoredOperatorState("timers")); got != 2 {
		t.Fatalf("middle subtask restored %d timer blobs, want 2", got)
	}
	for rec, v := range model {
		b := route(rec, 3, news)
		got, ok := read(t, b, key(1, rec, "x"))
		if !ok || string(got) != v {
			t.Fatalf("%s: %q %v", rec, got, ok)
		}
	}
	// The old subtasks are fenced by the new ones' claims.
	snap, _ := olds[0].Capture(8)
	if err := snap.Persist(context.Background()); !errors.Is(err, ErrFenced) {
		t.Fatalf("old-parallelism writer not fenced: %v", err)
	}
	// The new lineages checkpoint incrementally on top of the foreign segments.
	for _, b := range news {
		checkpoint(t, b, 8)
	}
	for _, b := range news {
		b.Close()
	}
	b := operator(t, s, OperatorOptions{Name: "agg", RestoreFrom: 8})
	for rec, v := range model {
		if got, ok := read(t, b, key(1, rec, "x")); !ok || string(got) != v {
			t.Fatalf("after rescale checkpoint %s: %q %v", rec, got, ok)
		}
	}
}

func TestFencing(t *testing.T) {
	for _, url := range []string{"mem://fence", "file://" + t.TempDir()} {
		s := openTest(t, url, WithFsync(false))
		old := operator(t, s, OperatorOptions{Name: "f"})
		old.Put(key(0, "a", ""), []byte("1"))
		checkpoint(t, old, 1)
		newer := operator(t, s, OperatorOptions{Name: "f", RestoreFrom: 1})
		old.Put(key(0, "a", ""), []byte("zombie"))
		snap, _ := old.Capture(2)
		if err := snap.Persist(context.Background()); !errors.Is(err, ErrFenced) {
			t.Fatalf("%s: stale writer not fenced: %v", url, err)
		}
		newer.Put(key(0, "a", ""), []byte("2"))
		checkpoint(t, newer, 2)
		r := operator(t, s, OperatorOptions{Name: "f", RestoreFrom: 2})
		if v, _ := read(t, r, key(0, "a", "")); string(v) != "2" {
			t.Fatalf("%s: got %q", url, v)
		}
	}
}

func TestCorruptionDetected(t *testing.T) {
	s := openTest(t, "mem://corrupt", WithPrefetchIndexes(false))
	b := operator(t, s, OperatorOptions{Name: "c"})
	for i := range 100 {
		b.Put(key(0, fmt.Sprint(i), ""), []byte("value"))
	}
	checkpoint(t, b, 1)
	ms := openMemStore("corrupt")
	objs, _ := ms.list(context.Background(), "operators/c/segments/")
	if len(objs) != 1 {
		t.Fatal(objs)
	}
	ms.corrupt(objs[0].name, 10) // inside the first block
	r := operator(t, s, OperatorOptions{Name: "c", RestoreFrom: 1})
	var keys []Key
	for i := range 100 {
		keys = append(keys, key(0, fmt.Sprint(i), ""))
	}
	if _, err := fetchSync(t, r, keys); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corruption not reported: %v", err)
	}
	if r.Metrics().Corruptions == 0 {
		t.Fatal("corruption not counted")
	}
	// A corrupt manifest fails the restore.
	mobjs, _ := ms.list(context.Background(), "operators/c/manifests/")
	ms.corrupt(mobjs[0].name, 12)
	if _, err := s.Operator(context.Background(), OperatorOptions{Name: "c", RestoreFrom: 1}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt manifest: %v", err)
	}
}

// TestCompactionAndGC runs in a synctest bubble: a sleep there returns only once every
// goroutine of the store (compaction, GC) is idle, so each commit's compaction has run.
func TestCompactionAndGC(t *testing.T) { synctest.Test(t, testCompactionAndGC) }

func testCompactionAndGC(t *testing.T) {
	s := openTest(t, "mem://compact", WithMaxSegments(3), WithRetention(0), withIntervals(time.Nanosecond, time.Second), WithRetainCheckpoints(2))
	b := operator(t, s, OperatorOptions{Name: "g"})
	model, at10 := map[string]string{}, map[string]string{}
	for c := 1; c <= 30; c++ {
		for i := range 50 {
			k := fmt.Sprint("k", (c*31+i*7)%200)
			if i%5 == 0 {
				b.Delete(key(0, k, ""))
				delete(model, k)
			} else {
				v := fmt.Sprint(c, "-", i)
				b.Put(key(0, k, ""), []byte(v))
				model[k] = v
			}
		}
		if c == 10 {
			for k, v := range model {
				at10[k] = v
			}
			snap, _ := b.CaptureSavepoint(uint64(c))
			if err := snap.Persist(context.Background()); err != nil {
				t.Fatal(err)
			}
		} else {
			checkpoint(t, b, uint64(c))
		}
		time.Sleep(2 * time.Millisecond) // the bubble's clock: compaction has finished
	}
	m := b.Metrics()
	if m.Compactions == 0 || m.Segments > 6 {
		t.Fatalf("compaction did not keep up: %+v", m)
	}
	b.Close()
	complete, sps, _ := s.Checkpoints(context.Background(), "", "g", 0)
	if len(sps) != 1 || sps[0] != 10 {
		t.Fatalf("savepoints %v", sps)
	}
	if len(complete) > 4 {
		t.Fatalf("retained %v", complete)
	}
	// Unreferenced segments are gone (retention 0): every stored segment is live somewhere.
	ms := openMemStore("compact")
	segs, _ := ms.list(context.Background(), "operators/g/segments/")
	mans, _ := ms.list(context.Background(), "operators/g/manifests/")
	live := map[string]bool{}
	for _, o := range mans {
		data, _ := ms.get(context.Background(), o.name, 0, -1)
		m, err := format.DecodeManifest(o.name, data)
		if err != nil {
			t.Fatal(err)
		}
		for _, sg := range m.Segs {
			live["operators/g/"+sg.Name] = true
		}
	}
	garbage := 0
	for _, o := range segs {
		if !live[o.name] {
			garbage++
		}
	}
	if garbage > 3 { // a compaction output or delta written after the last collection
		t.Fatalf("%d of %d segments unreferenced after GC", garbage, len(segs))
	}
	for id, want := range map[uint64]map[string]string{30: model, 10: at10} {
		r := operator(t, s, OperatorOptions{Name: "g", RestoreFrom: id})
		for i := range 200 {
			k := fmt.Sprint("k", i)
			v, ok := read(t, r, key(0, k, ""))
			if w, wantOK := want[k]; ok != wantOK || string(v) != w {
				t.Fatalf("checkpoint %d %s: got %q,%v want %q,%v", id, k, v, ok, w, wantOK)
			}
		}
		r.Close()
	}
}

func TestWaterFill(t *testing.T) {
	got := waterFill(100, []int64{10, -1, -1, 50})
	if got[0] != 10 || got[1] != 30 || got[2] != 30 || got[3] != 30 {
		t.Fatalf("%v", got)
	}
	got = waterFill(100, []int64{10, 20})
	if got[0]+got[1] != 100 {
		t.Fatalf("%v", got)
	}
	// Tenant fairness: tenant a has 3 greedy subtasks, tenant b one; b gets half.
	bu := newBudget(1 << 30)
	var as []*budgetMember
	for i := range 3 {
		m := &budgetMember{tenant: "a", op: fmt.Sprint("op", i)}
		as = append(as, m)
		bu.join(m)
	}
	bm := &budgetMember{tenant: "b", op: "x"}
	bu.join(bm)
	fixed := &budgetMember{tenant: "b", op: "y", fixed: 1 << 20}
	bu.join(fixed)
	for _, m := range append(as, bm) { // everyone uses all it has: greedy
		m.usage.Store(m.limit.Load())
	}
	bu.rebalance()
	if l := bm.limit.Load(); l < (1<<30-1<<20)/2-1 || l > (1<<30)/2 {
		t.Fatalf("tenant b limit %d", l)
	}
	if fixed.limit.Load() != 1<<20 {
		t.Fatal("override ignored")
	}
	var sum int64
	for _, m := range as {
		sum += m.limit.Load()
	}
	if sum+bm.limit.Load()+fixed.limit.Load() > 1<<30 {
		t.Fatal("over budget")
	}
}

func TestKeyGroupRanges(t *testing.T) {
	for _, p := range []int{1, 3, 7, 128} {
		at := 0
		for i := range p {
			r := KeyGroupRangeFor(i, p, 128)
			if r.Lo != at || r.Empty() {
				t.Fatalf("p=%d i=%d %v", p, i, r)
			}
			at = r.Hi
		}
		if at != 128 {
			t.Fatal(p, at)
		}
	}
	// Key groups are stable (the same key always lands in the same group, across calls and
	// byte slices), in range, and spread keys over the groups.
	counts := make([]int, 128)
	for i := range 128 * 64 {
		k := fmt.Sprint("user-", i)
		g := KeyGroupOf([]byte(k), 128)
		if g < 0 || g >= 128 {
			t.Fatalf("key %s in group %d of 128", k, g)
		}
		if again := KeyGroupOf(append([]byte(nil), k...), 128); again != g {
			t.Fatalf("key %s: group %d, then %d", k, g, again)
		}
		counts[g]++
	}
	for g, n := range counts {
		if n < 16 || n > 160 { // 64 expected per group
			t.Fatalf("group %d holds %d of %d keys: the hash does not spread", g, n, 128*64)
		}
	}
	// The group decides the owning subtask: KeyGroupRangeFor's ranges contain it.
	g := KeyGroupOf([]byte("user-42"), 128)
	owners := 0
	for i := range 7 {
		if r := KeyGroupRangeFor(i, 7, 128); g >= r.Lo && g < r.Hi {
			owners++
		}
	}
	if owners != 1 {
		t.Fatalf("group %d owned by %d of 7 subtasks", g, owners)
	}
}

// TestGlobalBudgetShared runs in a synctest bubble, so "let the budget rebalance" is exactly
// four rebalances of the bubble's clock, each run to completion.
func TestGlobalBudgetShared(t *testing.T) { synctest.Test(t, testGlobalBudgetShared) }

func testGlobalBudgetShared(t *testing.T) {
	const budget = 256 << 10
	s := openTest(t, "mem://", WithHotBytes(budget), withIntervals(time.Minute, 5*time.Millisecond))
	var bs []*Tiered
	for i := range 4 {
		bs = append(bs, operator(t, s, OperatorOptions{Name: fmt.Sprint("op", i), Tenant: fmt.Sprint("t", i%2)}))
	}
	val := make([]byte, 100)
	for round := range 3 {
		for i := range 3000 {
			for _, b := range bs {
				b.Put(key(0, fmt.Sprint(i), ""), val)
			}
		}
		for _, b := range bs {
			checkpoint(t, b, uint64(round+1))
			b.Get(key(0, "x", ""))
		}
		time.Sleep(20 * time.Millisecond) // four rebalances (every 5 ms of the bubble's clock)
		for _, b := range bs {
			b.Get(key(0, "x", ""))
		}
	}
	m := s.Metrics()
	if m.HotBytes > budget+4*int64(len(val)+entryOverhead+8) {
		t.Fatalf("store holds %d hot bytes, budget %d", m.HotBytes, budget)
	}
	for _, b := range bs {
		if l := b.Metrics().HotLimit; l < budget/8 || l > budget/2 {
			t.Fatalf("unfair limit %d of %d", l, budget)
		}
	}
}

// slowGets delays every ranged GET by a fixed time of the bubble's clock.
type slowGets struct {
	objectStore
	d time.Duration
}

func (s slowGets) get(ctx context.Context, name string, off, n int64) ([]byte, error) {
	time.Sleep(s.d)
	return s.objectStore.get(ctx, name, off, n)
}

// TestLookupRoundTrips: a fetch of keys spread over many segments (dirty keys spilled at half
// the budget) costs two round trips, the segments' indexes then their blocks, not two per
// segment: at 20 ms a GET, one batch over 40 spills took 1.6 s (issue 10).
func TestLookupRoundTrips(t *testing.T) { synctest.Test(t, testLookupRoundTrips) }

func testLookupRoundTrips(t *testing.T) {
	const lat = 20 * time.Millisecond
	// No compaction (it reads segments in the background); the pool is wrapped before
	// any backend can use it.
	s := openTest(t, "mem://", WithHotBytes(8<<10), WithPrefetchIndexes(false), WithIOConcurrency(256), WithMaxSegments(1<<20))
	s.os = slowGets{objectStore: s.os, d: lat}
	b := operator(t, s, OperatorOptions{})
	val := bytes.Repeat([]byte("x"), 100)
	for i := range 2000 {
		b.Put(key(0, fmt.Sprint("k", i), ""), val)
	}
	checkpoint(t, b, 1)
	// A restore: the indexes are not loaded yet.
	r := operator(t, s, OperatorOptions{RestoreFrom: RestoreLatest})
	if m := r.Metrics(); m.Segments < 20 {
		t.Fatalf("only %d segments: %+v", m.Segments, m)
	}
	var ks []Key
	for i := 0; i < 2000; i += 7 {
		ks = append(ks, key(0, fmt.Sprint("k", i), ""))
	}
	start := time.Now()
	f, err := fetchSync(t, r, ks)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start) // the bubble's clock: GETs in parallel overlap exactly
	for i, x := range f {
		if !x.Found || !bytes.Equal(x.Value, val) {
			t.Fatalf("key %s: %+v", ks[i].Record, x)
		}
	}
	// Two rounds, a third only if a filter's false positive sent a key to a block no other
	// key needed.
	m := r.Metrics()
	if took > 3*lat {
		t.Fatalf("fetch over %d segments took %v of GETs at %v each (%d blocks read): the segments were read one after the other", m.Segments, took, lat, m.FetchBlocks)
	}
	// About one block per segment (each spill is one block here), plus the false positives'.
	if m.FetchBlocks > int64(m.Segments)+int64(len(ks))/10 {
		t.Fatalf("%d blocks read for %d keys over %d segments", m.FetchBlocks, len(ks), m.Segments)
	}
}

// TestWrittenSegmentsNeedNoIndexRead: the indexes of the segments a backend wrote itself
// (spills, checkpoints) are installed from what it wrote, so its cold reads GET blocks only.
// waitMerges waits until no merge of spills is running (see compactSpills).
func waitMerges(t testing.TB, b *Tiered) {
	t.Helper()
	for range 10000 {
		b.mu.Lock()
		merging := b.mu.merging
		b.mu.Unlock()
		if !merging {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("a merge of spills never finished")
}

func TestWrittenSegmentsNeedNoIndexRead(t *testing.T) {
	// No compaction: it reads segments in the background.
	s := openTest(t, "mem://", WithHotBytes(8<<10), WithMaxSegments(1<<20))
	b := operator(t, s, OperatorOptions{})
	val := bytes.Repeat([]byte("x"), 100)
	for i := range 2000 {
		b.Put(key(0, fmt.Sprint("k", i), ""), val)
	}
	checkpoint(t, b, 1)
	b.Get(key(0, "k0", "")) // observes the commit and evicts
	var cold []Key
	for i := range 2000 {
		k := key(0, fmt.Sprint("k", i), "")
		if _, _, hot := b.Get(k); !hot {
			cold = append(cold, k)
		}
	}
	// A merge of the spills that started before the checkpoint adopted them reads them back
	// in the background (about two dozen GETs): let it finish before counting the Fetch's.
	waitMerges(t, b)
	before := b.Metrics()
	if before.Spills < 10 || len(cold) < 1500 {
		t.Fatalf("%d spills, %d cold keys: %+v", before.Spills, len(cold), before)
	}
	if _, err := fetchSync(t, b, cold); err != nil {
		t.Fatal(err)
	}
	after := b.Metrics()
	// Reading the indexes back would cost a GET per segment. Garbage collection may read the
	// manifest meanwhile (a GET that is not a block), so allow a few, far fewer than one per
	// segment.
	if metas := after.MetaLoads - before.MetaLoads; metas > int64(after.Segments)/8 {
		t.Fatalf("%d index reads over %d segments: indexes read back", metas, after.Segments)
	}
	if gets, blocks := after.RemoteGets-before.RemoteGets, after.FetchBlocks-before.FetchBlocks; gets > blocks+int64(after.Segments)/8 {
		t.Fatalf("%d GETs for %d blocks over %d segments", gets, blocks, after.Segments)
	}
}

// TestConcurrentFetchesShareReads: Fetches issued while the backend's lookups are busy wait and
// go as one lookup, and the blocks of one segment that a lookup needs come in one ranged GET.
// 64 Fetches of 8 keys each over one segment of many blocks would cost a GET per block each
// (about 64 x 8); here they cost a few per lookup.
func TestConcurrentFetchesShareReads(t *testing.T) { synctest.Test(t, testConcurrentFetchesShareReads) }

func testConcurrentFetchesShareReads(t *testing.T) {
	s := openTest(t, "mem://", WithPrefetchIndexes(false), WithBlockSize(1<<10))
	s.os = slowGets{objectStore: s.os, d: 20 * time.Millisecond}
	b := operator(t, s, OperatorOptions{})
	val := bytes.Repeat([]byte("v"), 50)
	for i := range 2000 {
		b.Put(key(0, fmt.Sprint("k", i), ""), val)
	}
	checkpoint(t, b, 1)
	r := operator(t, s, OperatorOptions{RestoreFrom: RestoreLatest})
	// One Fetch first loads the segment's index (concurrent loads would wait on a mutex,
	// which a synctest bubble does not count as durably blocked).
	if _, err := fetchSync(t, r, []Key{key(0, "k1", "")}); err != nil {
		t.Fatal(err)
	}
	before := r.Metrics()
	type res struct {
		keys []Key
		f    []Fetched
		err  error
	}
	ch := make(chan res, 64)
	for i := range 64 {
		var keys []Key
		for j := range 8 {
			keys = append(keys, key(0, fmt.Sprint("k", (i*8+j)*3), ""))
		}
		r.Fetch(keys, func(f []Fetched, err error) { ch <- res{keys, f, err} })
	}
	for range 64 {
		x := <-ch
		if x.err != nil {
			t.Fatal(x.err)
		}
		for i, f := range x.f {
			if !f.Found || !bytes.Equal(f.Value, val) || !bytes.Equal(f.Key.Record, x.keys[i].Record) {
				t.Fatalf("key %s: %+v", x.keys[i].Record, f)
			}
		}
	}
	m := r.Metrics()
	gets, blocks := m.RemoteGets-before.RemoteGets-(m.MetaLoads-before.MetaLoads), m.FetchBlocks-before.FetchBlocks
	if m.Segments != 1 || blocks < 64 {
		t.Fatalf("want one segment of many blocks: %d segments, %d blocks read", m.Segments, blocks)
	}
	if gets > 16 {
		t.Fatalf("%d block GETs (%d blocks) for 64 concurrent Fetches of one segment", gets, blocks)
	}
}

// failSegmentGets fails every read of a segment. In TestBackgroundFailureLogged, whose
// backend never reads a key back, only compaction reads segments.
type failSegmentGets struct{ objectStore }

func (f failSegmentGets) get(ctx context.Context, name string, off, n int64) ([]byte, error) {
	if strings.Contains(name, "segments/") {
		return nil, &Error{Op: "get", Object: name, Retryable: true, Err: errors.New("injected")}
	}
	return f.objectStore.get(ctx, name, off, n)
}

// chanHandler sends each record's message to a channel.
type chanHandler struct{ ch chan slog.Record }

func (h chanHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h chanHandler) Handle(_ context.Context, r slog.Record) error {
	select {
	case h.ch <- r:
	default:
	}
	return nil
}
func (h chanHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h chanHandler) WithGroup(string) slog.Handler      { return h }

// TestBackgroundFailureLogged: a compaction that fails (no caller sees its error) is logged
// through WithLogger, naming the operator.
func TestBackgroundFailureLogged(t *testing.T) {
	ch := make(chan slog.Record, 16)
	s := openTest(t, "mem://", WithMaxSegments(2), WithLogger(slog.New(chanHandler{ch})))
	s.os = failSegmentGets{s.os}
	b := operator(t, s, OperatorOptions{Name: "logged"})
	for c := uint64(1); c <= 4; c++ {
		b.Put(key(0, fmt.Sprint("k", c), ""), []byte("v"))
		checkpoint(t, b, c)
	}
	select {
	case r := <-ch:
		var op string
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "operator" {
				op = a.Value.String()
			}
			return true
		})
		if r.Level != slog.LevelWarn || !strings.Contains(r.Message, "compaction failed") || op != "logged" {
			t.Fatalf("logged %v %q operator=%q", r.Level, r.Message, op)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the failed compaction was not logged")
	}
}

// TestSetHotBytes: a budget changed while backends run (a live quota) re-shares their limits
// at once, and a backend over its new limit evicts down to it.
func TestSetHotBytes(t *testing.T) { synctest.Test(t, testSetHotBytes) }

func testSetHotBytes(t *testing.T) {
	s := openTest(t, "mem://", WithHotBytes(1<<20), withIntervals(time.Minute, 5*time.Millisecond))
	b := operator(t, s, OperatorOptions{Name: "op"})
	val := make([]byte, 100)
	for i := range 5000 {
		b.Put(key(0, fmt.Sprint(i), ""), val)
	}
	checkpoint(t, b, 1)
	b.Get(key(0, "x", ""))
	if m := b.Metrics(); m.HotBytes < 256<<10 {
		t.Fatalf("only %d hot bytes before the change: the test does not exercise eviction", m.HotBytes)
	}
	s.SetHotBytes(64 << 10)
	if got := s.HotBytes(); got != 64<<10 {
		t.Fatalf("HotBytes %d, want %d", got, 64<<10)
	}
	b.Put(key(0, "y", ""), val) // a write evicts down to the limit
	m := b.Metrics()
	if m.HotLimit != 64<<10 {
		t.Fatalf("backend limit %d after SetHotBytes(64 KiB)", m.HotLimit)
	}
	if m.HotBytes > 64<<10+int64(len(val)+entryOverhead+8) {
		t.Fatalf("backend holds %d hot bytes at a limit of %d", m.HotBytes, 64<<10)
	}
}

// TestLastEntryEvicted: the entry find remembers is forgotten when it is evicted, so a write
// after the eviction makes a new hot entry instead of writing to the evicted one.
func TestLastEntryEvicted(t *testing.T) {
	s := openTest(t, "mem://lastentry")
	b := operator(t, s, OperatorOptions{HotBytes: 1})
	a := key(0, "a", "")
	hk := AppendKey(nil, a)
	b.Put(a, []byte("1")) // the last entry found is a's
	checkpoint(t, b, 1)
	b.Get(key(1, "zz", "")) // observes the commit: a is clean, and evicted
	if _, ok := b.run.hot[string(hk)]; ok {
		t.Fatal("a was not evicted")
	}
	b.Put(a, []byte("2"))
	e, ok := b.run.hot[string(hk)]
	if !ok || string(e.c.Load().value) != "2" {
		t.Fatalf("the write after the eviction is not in the hot tier: %v", ok)
	}
	if v, _ := read(t, b, a); string(v) != "2" {
		t.Fatalf("read %q", v)
	}
}

// maxSegmentRead records the largest read of a segment (a whole-object read counts as its
// size).
type maxSegmentRead struct {
	objectStore
	mu  sync.Mutex
	max int64
}

func (m *maxSegmentRead) get(ctx context.Context, name string, off, n int64) ([]byte, error) {
	data, err := m.objectStore.get(ctx, name, off, n)
	if strings.Contains(name, "segments/") {
		m.mu.Lock()
		m.max = max(m.max, int64(len(data)))
		m.mu.Unlock()
	}
	return data, err
}

// TestCompactionReadsInBatches: a compaction of segments several times scanBatch reads each
// in ranged batches (what it holds is bounded, whatever the segments' size), and the merged
// state is exact.
func TestCompactionReadsInBatches(t *testing.T) { synctest.Test(t, testCompactionReadsInBatches) }

func testCompactionReadsInBatches(t *testing.T) {
	s := openTest(t, "mem://compactbatches", WithMaxSegments(2), WithRetention(0), withIntervals(time.Nanosecond, time.Second),
		WithSegmentBytes(64<<20), WithHotBytes(64<<20))
	rec := &maxSegmentRead{objectStore: s.os}
	s.os = rec
	b := operator(t, s, OperatorOptions{Name: "big"})
	model := map[string]string{}
	val := bytes.Repeat([]byte("v"), 1000)
	for c := 1; c <= 4; c++ {
		for i := range 3000 { // ~3 MB a checkpoint: one segment of ~3 scanBatches
			k := fmt.Sprint("k", (c*1009+i*7)%6000)
			if i%7 == 0 {
				b.Delete(key(0, k, ""))
				delete(model, k)
				continue
			}
			v := fmt.Sprintf("%d-%d-%s", c, i, val)
			b.Put(key(0, k, ""), []byte(v))
			model[k] = v
		}
		checkpoint(t, b, uint64(c))
		time.Sleep(2 * time.Millisecond) // the bubble's clock: compaction has finished
	}
	m := b.Metrics()
	b.Close()
	if m.Compactions == 0 {
		t.Fatalf("no compaction: %+v", m)
	}
	if rec.max == 0 || rec.max > scanBatch+64<<10 {
		t.Fatalf("largest segment read %d bytes, want (0, scanBatch+a block]", rec.max)
	}
	r := operator(t, s, OperatorOptions{Name: "big", RestoreFrom: 4})
	defer r.Close()
	for i := range 6000 {
		k := fmt.Sprint("k", i)
		v, ok := read(t, r, key(0, k, ""))
		if w, wantOK := model[k]; ok != wantOK || string(v) != w {
			t.Fatalf("%s: got %.20q,%v want %.20q,%v", k, v, ok, w, wantOK)
		}
	}
}
