package scheduler

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// fakeLookup answers each request after a random latency with body = the request's path, and
// tracks how many requests were in flight at once.
type fakeLookup struct {
	rng      *rand.Rand
	mu       sync.Mutex
	inflight atomic.Int64
	maxSeen  atomic.Int64
	calls    atomic.Int64
	wg       sync.WaitGroup
}

func (f *fakeLookup) do(_ context.Context, ep uint32, req []byte, done func(int, []byte, error)) {
	f.calls.Add(1)
	n := f.inflight.Add(1)
	for m := f.maxSeen.Load(); n > m && !f.maxSeen.CompareAndSwap(m, n); m = f.maxSeen.Load() {
	}
	f.mu.Lock()
	lat := time.Duration(f.rng.Int64N(int64(3 * time.Millisecond)))
	f.mu.Unlock()
	path := strings.TrimPrefix(string(req), "GET ")
	f.wg.Add(1)
	time.AfterFunc(lat, func() {
		defer f.wg.Done()
		f.inflight.Add(-1)
		if strings.Contains(path, "fail") {
			done(0, nil, abi.LookupTimeout)
			return
		}
		done(200, []byte(path), nil)
	})
}

type enrichOut struct {
	key, body     string
	getRC, status int32
}

func decodeEnrich(o out) enrichOut {
	n := len(o.value) - 8
	return enrichOut{key: o.key, body: string(o.value[:n]),
		getRC: int32(binary.LittleEndian.Uint32(o.value[n:])), status: int32(binary.LittleEndian.Uint32(o.value[n+4:]))}
}

func enrichRun(t *testing.T, order Order, n, keys int) ([]out, *fakeLookup, []Element) {
	m := loadModule(t, "testdata/enrich.wasm")
	var outs []out
	var fl *fakeLookup
	var els []Element
	synctest.Test(t, func(t *testing.T) {
		fl = &fakeLookup{rng: rand.New(rand.NewPCG(5, 5))}
		sink := &collectSink{}
		perKey := map[string]int{}
		for i := range n {
			k := fmt.Sprint("k", i%keys)
			els = append(els, Element{Kind: ElementRecord, Key: []byte(k), Value: []byte(fmt.Sprintf("GET /%s/%d", k, perKey[k])), Pos: int64(i + 1)})
			perKey[k]++
			if i%50 == 49 {
				els = append(els, Element{Kind: ElementWatermark, TS: int64(i)})
			}
		}
		els = append(els, Element{Kind: ElementWatermark, TS: math.MaxInt64})
		c, err := New(m, state.NewMemory(), sink, WithLookup(fl.do), WithMaxInFlight(64), WithOrder(order))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Run(context.Background(), feed(els, 32)); err != nil {
			t.Fatal(err)
		}
		fl.wg.Wait()
		outs = sink.outs
	})
	return outs, fl, els
}

func TestLookupsPerKeyOrder(t *testing.T) {
	outs, fl, _ := enrichRun(t, OrderPerKey, 600, 40)
	next := map[string]int{}
	got := 0
	for _, o := range outs {
		if o.kind != OutputData {
			continue
		}
		e := decodeEnrich(o)
		want := fmt.Sprintf("/%s/%d", e.key, next[e.key])
		if e.body != want || e.status != 200 || e.getRC != int32(abi.NotFound) {
			t.Fatalf("got %+v, want body %s status 200 get NOT_FOUND", e, want)
		}
		next[e.key]++
		got++
	}
	if got != 600 {
		t.Fatalf("%d outputs for 600 records", got)
	}
	if fl.maxSeen.Load() < 10 {
		t.Errorf("at most %d lookups overlapped: lookups of distinct keys should run concurrently", fl.maxSeen.Load())
	}
}

func TestLookupsInputOrder(t *testing.T) {
	outs, fl, els := enrichRun(t, OrderInput, 600, 7)
	i := 0
	for _, o := range outs {
		if o.kind != OutputData {
			continue
		}
		for els[i].Kind != ElementRecord {
			i++
		}
		e := decodeEnrich(o)
		if want := strings.TrimPrefix(string(els[i].Value), "GET "); e.body != want {
			t.Fatalf("output %d is %s, want %s: input order broken", i, e.body, want)
		}
		if e.getRC != int32(abi.NotAllowed) {
			t.Fatalf("keyed state allowed in input-order mode: %d", e.getRC)
		}
		i++
	}
	// Only 7 keys, yet far more than 7 lookups overlapped: records of one key run concurrently.
	if fl.maxSeen.Load() < 20 {
		t.Errorf("at most %d lookups overlapped", fl.maxSeen.Load())
	}
}

func TestLookupsUnordered(t *testing.T) {
	outs, _, els := enrichRun(t, OrderNone, 600, 7)
	inputIdx := map[string]int{}
	wmIdx := map[int64]int{}
	for i, e := range els {
		if e.Kind == ElementRecord {
			inputIdx[strings.TrimPrefix(string(e.Value), "GET ")] = i
		} else {
			wmIdx[e.TS] = i
		}
	}
	seen := map[string]bool{}
	inOrder, prev := true, -1
	for _, o := range outs {
		switch o.kind {
		case OutputWatermark:
			// Every record before this watermark in the input is already out.
			for body, idx := range inputIdx {
				if idx < wmIdx[o.ts] && !seen[body] {
					t.Fatalf("watermark %d overtook %s", o.ts, body)
				}
			}
		case OutputData:
			e := decodeEnrich(o)
			seen[e.body] = true
			if inputIdx[e.body] < prev {
				inOrder = false
			}
			prev = inputIdx[e.body]
		}
	}
	if len(seen) != 600 {
		t.Fatalf("%d distinct outputs for 600 records", len(seen))
	}
	if inOrder {
		t.Error("unordered mode produced input order: the test proves nothing")
	}
}

// TestLookupsWithinCap: the in-flight cap bounds the lookups outstanding, also while the runner
// drains at the end of the input (when records waiting for room may fetch beyond the cap, see
// fetchCap): an endpoint's queue sized for the cap must never overflow. 2,000 records of
// distinct keys, cap 16, over a tier where every key is cold: enrich reads state it does not
// prefetch, enrichpf prefetches it (so at the cap its records wait for room, then fetch).
func TestLookupsWithinCap(t *testing.T) {
	for _, mod := range []string{"enrich", "enrichpf"} {
		t.Run(mod, func(t *testing.T) {
			m := loadModule(t, "testdata/"+mod+".wasm")
			synctest.Test(t, func(t *testing.T) {
				fl := &fakeLookup{rng: rand.New(rand.NewPCG(7, 7))}
				sink := &collectSink{}
				var els []Element
				for i := range 2000 {
					k := fmt.Sprint("k", i)
					els = append(els, Element{Kind: ElementRecord, Key: []byte(k), Value: []byte("GET /" + k), Pos: int64(i + 1)})
				}
				els = append(els, Element{Kind: ElementWatermark, TS: math.MaxInt64})
				tier := newFakeTier(7, time.Millisecond, 3*time.Millisecond, 0)
				c, err := New(m, tier, sink, WithLookup(fl.do), WithMaxInFlight(16))
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Run(context.Background(), feed(els, 64)); err != nil {
					t.Fatal(err)
				}
				fl.wg.Wait()
				tier.pending.Wait()
				if n := fl.calls.Load(); n != 2000 {
					t.Fatalf("%d lookups for 2000 records", n)
				}
				if tier.fetches.Load() == 0 {
					t.Fatal("no fetches: the tier's keys were meant to be cold")
				}
				if m := fl.maxSeen.Load(); m > 16 || m < 8 {
					t.Fatalf("at most %d lookups were outstanding at once; the cap is 16", m)
				}
			})
		})
	}
}
