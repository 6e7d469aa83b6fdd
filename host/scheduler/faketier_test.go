package scheduler

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/host/state"
)

// fakeTier is a state.Backend with a hot tier in front of a "remote" map whose fetches complete
// after random latencies, so completions arrive in random order. Clean hot entries are evicted at
// random, so keys go cold again; dirty ones never are. Capture commits dirty entries to the
// remote map, as a checkpoint would.
type fakeTier struct {
	mu     sync.Mutex
	remote map[string][]byte // guarded by mu: read by fetch goroutines

	// Runner-only.
	hot      map[string]hotEntry
	rng      *rand.Rand
	minLat   time.Duration
	maxLat   time.Duration
	evictP   float64
	opState  map[string][]byte
	scratch  []byte
	fetchErr error

	fetches   atomic.Int64
	misses    int // Gets that found a key cold (runner-only)
	fetchKeys atomic.Int64
	undone    atomic.Int64 // fetches whose done has not returned
	pending   sync.WaitGroup
}

type hotEntry struct {
	val   []byte
	found bool
	dirty bool
}

func newFakeTier(seed uint64, minLat, maxLat time.Duration, evictP float64) *fakeTier {
	return &fakeTier{
		remote: map[string][]byte{}, hot: map[string]hotEntry{},
		rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), minLat: minLat, maxLat: maxLat,
		evictP: evictP, opState: map[string][]byte{},
	}
}

func (f *fakeTier) enc(k state.Key) string {
	f.scratch = state.AppendKey(f.scratch[:0], k)
	return string(f.scratch)
}

func (f *fakeTier) Open([]string) error { return nil }

func (f *fakeTier) Get(k state.Key) ([]byte, bool, bool) {
	e, ok := f.hot[f.enc(k)]
	if !ok {
		f.misses++
		return nil, false, false
	}
	return e.val, e.found, true
}

func (f *fakeTier) Put(k state.Key, v []byte) {
	f.hot[f.enc(k)] = hotEntry{val: bytes.Clone(v), found: true, dirty: true}
}

func (f *fakeTier) Delete(k state.Key) { f.hot[f.enc(k)] = hotEntry{dirty: true} }

func (f *fakeTier) latency() time.Duration {
	if f.maxLat <= f.minLat {
		return f.minLat
	}
	return f.minLat + time.Duration(f.rng.Int64N(int64(f.maxLat-f.minLat)))
}

func (f *fakeTier) Fetch(keys []state.Key, done func([]state.Fetched, error)) {
	f.fetches.Add(1)
	f.fetchKeys.Add(int64(len(keys)))
	ks := make([]state.Key, len(keys))
	encs := make([]string, len(keys))
	for i, k := range keys {
		ks[i] = state.Key{State: k.State, Record: bytes.Clone(k.Record), Entry: bytes.Clone(k.Entry)}
		encs[i] = f.enc(k)
	}
	err := f.fetchErr
	f.pending.Add(1)
	f.undone.Add(1)
	time.AfterFunc(f.latency(), func() {
		defer f.pending.Done()
		if err != nil {
			f.undone.Add(-1)
			done(nil, err)
			return
		}
		res := make([]state.Fetched, len(ks))
		f.mu.Lock()
		for i := range ks {
			v, ok := f.remote[encs[i]]
			res[i] = state.Fetched{Key: ks[i], Value: bytes.Clone(v), Found: ok}
		}
		f.mu.Unlock()
		f.undone.Add(-1) // before done: once the runner has taken the completion, it shows
		done(res, nil)
	})
}

func (f *fakeTier) Fill(res []state.Fetched) {
	for _, r := range res {
		k := f.enc(r.Key)
		if _, ok := f.hot[k]; !ok {
			f.hot[k] = hotEntry{val: r.Value, found: r.Found}
		}
	}
	// Evict some clean entries so keys go cold again.
	if f.evictP > 0 {
		for k, e := range f.hot {
			if !e.dirty && f.rng.Float64() < f.evictP {
				delete(f.hot, k)
			}
		}
	}
}

func (f *fakeTier) SetOperatorState(name string, data []byte) { f.opState[name] = bytes.Clone(data) }
func (f *fakeTier) OperatorState(name string) []byte          { return f.opState[name] }

// Capture commits the dirty entries (synchronously: the fake has no persist phase).
func (f *fakeTier) Capture(uint64) (state.Snapshot, error) {
	f.mu.Lock()
	for k, e := range f.hot {
		if e.dirty {
			if e.found {
				f.remote[k] = e.val
			} else {
				delete(f.remote, k)
			}
			f.hot[k] = hotEntry{val: e.val, found: e.found}
		}
	}
	f.mu.Unlock()
	return nilSnapshot{}, nil
}

// view returns the merged (hot over remote) value of k.
func (f *fakeTier) view(k state.Key) ([]byte, bool) {
	enc := f.enc(k)
	if e, ok := f.hot[enc]; ok {
		return e.val, e.found
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.remote[enc]
	return v, ok
}

func (f *fakeTier) Close() error { return nil }

type nilSnapshot struct{}

func (nilSnapshot) Persist(context.Context) error { return nil }
func (nilSnapshot) Bytes() int64                  { return 0 }
