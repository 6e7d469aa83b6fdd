package scheduler

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clink-wasm/clink-wasm/host/state"
)

// batchRun is what one run of a workload produced, for comparing batch calls with calls of
// their own.
type batchRun struct {
	perKey   map[string][]string // per key: its data outputs in order
	dead     []int64             // dead-lettered records' positions, sorted
	err      error
	calls    int64 // batch calls made
	batched  int64 // records they carried
	suspends int64 // suspensions inside batch calls
	// favourable: the run's in-flight cap and input chunks leave room for batches (a cap of
	// 1, or chunks of a record or two, make batches of one, which run as calls of their own).
	favourable bool
}

// runBatchWorkload runs elems through module with the given batch size, on a tier that
// evicts (so reads inside calls go cold and suspend) unless evict is 0.
func runBatchWorkload(t *testing.T, module string, seed uint64, elems []Element, batch int, mode ExecMode, deadLetters bool) batchRun {
	m := loadModule(t, module)
	var r batchRun
	synctest.Test(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(seed, 11))
		evict := rng.Float64() * 0.5
		if seed%3 == 0 {
			evict = 0
		}
		tier := newFakeTier(seed, 0, time.Duration(1+rng.IntN(3))*time.Millisecond, evict)
		sink := &collectSink{}
		var mu sync.Mutex
		maxInFlight := 1 + rng.IntN(64)
		opts := []Option{WithCallBatch(batch), WithExecMode(mode), WithMaxInFlight(maxInFlight)}
		if deadLetters {
			opts = append(opts, WithOnRecordFailure(func(f RecordFailure) error {
				mu.Lock()
				r.dead = append(r.dead, f.Pos)
				mu.Unlock()
				if !strings.Contains(f.Err.Error(), fmt.Sprintf("record #%d", f.Pos)) {
					return fmt.Errorf("dead letter of record %d names another: %v", f.Pos, f.Err)
				}
				return nil
			}))
		}
		c, err := New(m, tier, sink, opts...)
		if err != nil {
			t.Fatal(err)
		}
		chunk := 1 + rng.IntN(100)
		r.favourable = maxInFlight >= 8 && chunk >= 8
		r.err = c.Run(context.Background(), feed(elems, chunk))
		tier.pending.Wait()
		r.calls, r.batched, r.suspends = c.batch.calls, c.batch.records, c.batch.suspends
		r.perKey = map[string][]string{}
		for _, o := range sink.outs {
			if o.kind == OutputData && int64(binary.LittleEndian.Uint64(o.value)) >= 0 {
				r.perKey[o.key] = append(r.perKey[o.key], fmt.Sprintf("%x", o.value))
			}
		}
		slices.Sort(r.dead)
	})
	return r
}

// poison replaces the value of about one record in rate with v (accumb and accumpfb trap on
// 0xFE bytes before doing anything, accumb on 0xFD bytes after its put).
func poison(rng *rand.Rand, elems []Element, rate int, b byte) []Element {
	out := slices.Clone(elems)
	for i := range out {
		if out[i].Kind == ElementRecord && rng.IntN(rate) == 0 {
			out[i].Value = []byte{b, b, b, b, b, b, b, b}
		}
	}
	return out
}

// TestBatchDifferential: batch calls give the same outputs, per key and in order, as calls of
// their own, over random workloads whose keys repeat within what would be a batch, on a tier
// whose evictions make reads inside batch calls suspend; and the batched run keeps every
// property of TestPropertiesRandomLatency (per-key order, read-your-writes, timers after their
// records, watermarks, barriers).
func TestBatchDifferential(t *testing.T) {
	seeds, records := soak()
	var suspends, calls int64
	defer func() {
		if !t.Failed() && (suspends == 0 || calls == 0) {
			t.Errorf("over every seed: %d batch calls, %d suspensions inside them", calls, suspends)
		}
	}()
	for _, module := range []string{"testdata/accumb.wasm", "testdata/accumpfb.wasm"} {
		for seed := uint64(1); seed <= seeds; seed++ {
			t.Run(fmt.Sprintf("%s/seed%d", module[9:], seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 3))
				w := genWorkload(rng, records, 1+rng.IntN(200))
				mode := ExecMode(seed % 3)
				own := runBatchWorkload(t, module, seed, w.elems, 1, mode, false)
				bat := runBatchWorkload(t, module, seed, w.elems, 2+rng.IntN(30), mode, false)
				if own.err != nil || bat.err != nil {
					t.Fatalf("runs failed: own %v, batched %v", own.err, bat.err)
				}
				if own.calls != 0 {
					t.Fatalf("WithCallBatch(1) made %d batch calls", own.calls)
				}
				if mode == ExecDirect && bat.favourable && len(w.perKey) >= 8 && bat.calls == 0 {
					t.Fatal("no batch call was made")
				}
				comparePerKey(t, own.perKey, bat.perKey)
				suspends += bat.suspends
				calls += bat.calls
				t.Logf("mode %d: %d batch calls, %.1f records each, %d suspensions inside them", mode, bat.calls, float64(bat.batched)/float64(max(1, bat.calls)), bat.suspends)
			})
		}
	}
}

func comparePerKey(t *testing.T, want, got map[string][]string) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%d keys with outputs, want %d", len(got), len(want))
	}
	for k, w := range want {
		if !slices.Equal(w, got[k]) {
			t.Fatalf("key %s: outputs differ\nown calls: %v\nbatched:   %v", k, w, got[k])
		}
	}
}

// TestBatchPropertiesDirect runs the property checks of TestPropertiesRandomLatency on batch
// calls, in direct mode where batches form.
func TestBatchPropertiesDirect(t *testing.T) {
	seeds, records := soak()
	for _, module := range []string{"testdata/accumb.wasm", "testdata/accumpfb.wasm"} {
		m := loadModule(t, module)
		for seed := uint64(1); seed <= seeds/2; seed++ {
			t.Run(fmt.Sprintf("%s/seed%d", module[9:], seed), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					rng := rand.New(rand.NewPCG(seed, 5))
					w := genWorkload(rng, records, 1+rng.IntN(300))
					tier := newFakeTier(seed, 0, time.Duration(1+rng.IntN(3))*time.Millisecond, rng.Float64()*0.5)
					sink := &collectSink{}
					var barrierErr error
					onBarrier := func(id uint64) error {
						for k, want := range w.barriers[id] {
							v, ok := tier.view(state.Key{Record: []byte(k)})
							var got uint64
							if ok {
								got = binary.LittleEndian.Uint64(v)
							}
							if got != want && barrierErr == nil {
								barrierErr = fmt.Errorf("barrier %d: key %s has count %d, want %d", id, k, got, want)
							}
						}
						_, err := tier.Capture(id)
						return err
					}
					maxInFlight := 1 + rng.IntN(64)
					c, err := New(m, tier, sink, WithExecMode(ExecDirect), WithMaxInFlight(maxInFlight), WithOnBarrier(onBarrier))
					if err != nil {
						t.Fatal(err)
					}
					chunk := 1 + rng.IntN(100)
					if err := c.Run(context.Background(), feed(w.elems, chunk)); err != nil {
						t.Fatal(err)
					}
					tier.pending.Wait()
					if barrierErr != nil {
						t.Fatal(barrierErr)
					}
					checkOutputs(t, w, sink.outs)
					if c.batch.calls == 0 && maxInFlight >= 8 && chunk >= 8 && len(w.perKey) >= 8 {
						t.Fatal("no batch call was made")
					}
					if s := c.Metrics(); s.Instances != 0 || s.InFlight != 0 || s.Parked != 0 {
						t.Errorf("leftovers after Run: %+v", s)
					}
				})
			})
		}
	}
}

// TestBatchTrapDeadLetters: records that trap before changing anything, in the middle of batch
// calls, are dead-lettered exactly as in calls of their own, each named by its own position,
// and the records after them in their batch still run (in calls of their own).
func TestBatchTrapDeadLetters(t *testing.T) {
	seeds, records := soak()
	for _, module := range []string{"testdata/accumb.wasm", "testdata/accumpfb.wasm"} {
		for seed := uint64(1); seed <= seeds/2; seed++ {
			t.Run(fmt.Sprintf("%s/seed%d", module[9:], seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 9))
				w := genWorkload(rng, records, 1+rng.IntN(200))
				elems := poison(rng, w.elems, 25, 0xFE)
				own := runBatchWorkload(t, module, seed, elems, 1, ExecDirect, true)
				bat := runBatchWorkload(t, module, seed, elems, 16, ExecDirect, true)
				if own.err != nil || bat.err != nil {
					t.Fatalf("runs failed: own %v, batched %v", own.err, bat.err)
				}
				if len(own.dead) == 0 || !slices.Equal(own.dead, bat.dead) {
					t.Fatalf("dead letters differ:\nown calls: %v\nbatched:   %v", own.dead, bat.dead)
				}
				if bat.calls == 0 && bat.favourable && len(w.perKey) >= 8 {
					t.Fatal("no batch call was made")
				}
				comparePerKey(t, own.perKey, bat.perKey)
			})
		}
	}
}

// TestBatchTrapAfterEffects: a record that traps after its put fails the run, naming that
// record, as it does in a call of its own.
func TestBatchTrapAfterEffects(t *testing.T) {
	var elems []Element
	for i := range 40 {
		elems = append(elems, rec(fmt.Sprintf("k%02d", i), 0, int64(1000+i), int64(i+1)))
	}
	elems[22].Value = []byte{0xFD, 0xFD, 0xFD, 0xFD, 0xFD, 0xFD, 0xFD, 0xFD}
	for _, batch := range []int{1, 16} {
		r := runBatchWorkload(t, "testdata/accumb.wasm", 3, elems, batch, ExecDirect, true)
		var oe *OperatorError
		if !errors.As(r.err, &oe) || !strings.Contains(r.err.Error(), "record #23") || !strings.Contains(r.err.Error(), `key "k22"`) {
			t.Fatalf("batch %d: want the run to fail naming record #23, got %v", batch, r.err)
		}
		if len(r.dead) != 0 {
			t.Fatalf("batch %d: a record with effects was dead-lettered: %v", batch, r.dead)
		}
		if batch > 1 && r.calls == 0 {
			t.Fatal("no batch call was made")
		}
	}
}
