package state

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// flakyStore fails a fraction of puts (retryable), to exercise failed checkpoints.
type flakyStore struct {
	objectStore
	mu   sync.Mutex
	rng  *rand.Rand
	rate float64
}

func (f *flakyStore) put(ctx context.Context, name string, data []byte, c putCond) (string, error) {
	f.mu.Lock()
	fail := f.rng.Float64() < f.rate
	f.mu.Unlock()
	if fail {
		return "", &Error{Op: "put", Object: name, Retryable: true, Err: errors.New("injected")}
	}
	return f.objectStore.put(ctx, name, data, c)
}

// TestPropertyEvictionNeverLosesDirty drives a backend with a tiny budget through random puts,
// deletes, reads (with fetch and fill, some fills stale), captures, in-order and out-of-band
// persists (some failing), and restores, checking every read against a model map.
func TestPropertyEvictionNeverLosesDirty(t *testing.T) {
	seeds := 20
	if testing.Short() {
		seeds = 5
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { propertyRun(t, uint64(seed)) })
	}
}

func propertyRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	name := fmt.Sprintf("prop-%d-%s", seed, randomHex(4))
	s := openTest(t, "mem://"+name, WithHotBytes(int64(1+rng.IntN(4))<<10), WithMaxSegments(3),
		WithBlockSize(256), WithPrefetchIndexes(rng.IntN(2) == 0))
	flaky := &flakyStore{objectStore: s.os, rng: rand.New(rand.NewPCG(seed, 7)), rate: 0.1}
	s.os = flaky
	var b *Tiered
	open := func(from uint64) {
		var err error
		b, err = s.Operator(context.Background(), OperatorOptions{Name: "p", RestoreFrom: from})
		if err != nil {
			t.Fatal(err)
		}
		b.Open(testNames)
	}
	open(0)
	defer func() { b.Close() }()

	type pend struct {
		snap  Snapshot
		model map[string]string
		id    uint64
	}
	model := map[string]string{}
	var committed map[string]string
	var committedID uint64
	var pending []pend
	nextID := uint64(1)
	var stale []Fetched
	mk := func(i int) Key { return key(i%2, fmt.Sprint("r", i), fmt.Sprint("e", i%3)) }
	mkey := func(k Key) string { return fmt.Sprintf("%d/%s/%s", k.State, k.Record, k.Entry) }
	check := func(k Key) {
		t.Helper()
		v, ok := read(t, b, k)
		want, wantOK := model[mkey(k)]
		if ok != wantOK || ok && string(v) != want {
			t.Fatalf("seed %d key %s: got %q,%v want %q,%v (metrics %+v)", seed, mkey(k), v, ok, want, wantOK, b.Metrics())
		}
	}
	persistOne := func() {
		p := pending[0]
		pending = pending[1:]
		if err := p.snap.Persist(context.Background()); err == nil {
			committed, committedID = p.model, p.id
		}
	}
	const keys = 150
	lastOp := 0
	for step := range 3000 {
		op := rng.IntN(100)
		lastOp = op
		switch {
		case op < 40:
			k := mk(rng.IntN(keys))
			v := fmt.Sprint(step, "-", rng.Int64())
			if rng.IntN(4) == 0 {
				v += string(make([]byte, rng.IntN(300)))
			}
			b.Put(k, []byte(v))
			model[mkey(k)] = v
		case op < 50:
			k := mk(rng.IntN(keys))
			b.Delete(k)
			delete(model, mkey(k))
		case op < 75:
			check(mk(rng.IntN(keys)))
		case op < 80:
			// Fetch now, fill later: the fill must never override a newer local write.
			var ks []Key
			for range 1 + rng.IntN(5) {
				k := mk(rng.IntN(keys))
				if _, _, hot := b.Get(k); !hot {
					ks = append(ks, k)
				}
			}
			if len(ks) > 0 {
				if f, err := fetchSync(t, b, ks); err == nil {
					stale = append(stale, f...)
				}
			}
		case op < 84:
			b.Fill(stale)
			stale = nil
		case op < 91:
			snap, err := b.Capture(nextID)
			if err != nil {
				t.Fatal(err)
			}
			cp := make(map[string]string, len(model))
			for k, v := range model {
				cp[k] = v
			}
			pending = append(pending, pend{snap, cp, nextID})
			nextID++
		case op < 98:
			if len(pending) > 0 {
				persistOne()
			}
		default:
			// Crash and restore from the last committed checkpoint.
			for len(pending) > 0 {
				persistOne()
			}
			b.Close()
			stale = nil
			flaky.mu.Lock()
			flaky.rate = 0
			flaky.mu.Unlock()
			open(committedID)
			flaky.mu.Lock()
			flaky.rate = 0.1
			flaky.mu.Unlock()
			model = map[string]string{}
			for k, v := range committed {
				model[k] = v
			}
		}
		m := b.Metrics()
		if m.HotOverflow > 0 && b.run.lru.prev != &b.run.lru {
			n := 0
			for e := b.run.lru.next; e != &b.run.lru; e = e.next {
				n++
				t.Logf("lru entry %q size %d gen %d holds %d settled %d", e.key, e.size, e.c.Load().gen, e.holds, b.run.settled)
			}
			t.Logf("bytes %d lru %d", b.run.bytes, n)
			t.Fatalf("op %d step %d: over budget with evictable entries: %+v limit now %d", lastOp, step, m, b.member.limit.Load())
		}
	}
	for i := range keys {
		check(mk(i))
	}
}
