package scheduler

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/state"
)

// TestPropertiesRealTier runs the property workload against the real tiered backend: a mem://
// pool, a hot budget far below the state size (so eviction and cold fetches really happen),
// checkpoints captured at every barrier and persisted. Afterwards a restore from the last
// checkpoint must hold every key's full count.
func TestPropertiesRealTier(t *testing.T) {
	m := loadModule(t, "testdata/accum.wasm")
	ctx := context.Background()
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			pool := fmt.Sprintf("mem://realtier-%d", seed)
			st, err := state.Open(ctx, pool, state.WithHotBytes(8<<10))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			b, err := st.Operator(ctx, state.OperatorOptions{Name: "accum"})
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Open(m.Manifest.States); err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(seed, 11))
			w := genWorkload(rng, 3000, 400)
			var last uint64
			sink := &collectSink{}
			c, err := New(m, b, sink, WithMaxInFlight(1+rng.IntN(128)), WithOnBarrier(func(id uint64) error {
				snap, err := b.Capture(id)
				if err != nil {
					return err
				}
				last = id
				return snap.Persist(ctx)
			}))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Run(ctx, feed(w.elems, 50)); err != nil {
				t.Fatal(err)
			}
			checkOutputs(t, w, sink.outs)
			s := c.Metrics()
			if s.StateMisses == 0 || s.ReadBatches == 0 {
				t.Fatalf("no cold reads: %+v", s)
			}
			// Final checkpoint, then restore into a fresh backend and check every key.
			last++
			c.SaveTimers()
			snap, err := b.Capture(last)
			if err != nil {
				t.Fatal(err)
			}
			if err := snap.Persist(ctx); err != nil {
				t.Fatal(err)
			}
			b.Close()
			st2, err := state.Open(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			defer st2.Close()
			rb, err := st2.Operator(ctx, state.OperatorOptions{Name: "accum", RestoreFrom: state.RestoreLatest})
			if err != nil {
				t.Fatal(err)
			}
			defer rb.Close()
			if err := rb.Open(m.Manifest.States); err != nil {
				t.Fatal(err)
			}
			var keys []state.Key
			var want []uint64
			for k, n := range w.perKey {
				keys = append(keys, state.Key{Record: []byte(k)})
				want = append(want, n)
			}
			done := make(chan []state.Fetched, 1)
			rb.Fetch(keys, func(res []state.Fetched, err error) {
				if err != nil {
					t.Error(err)
				}
				done <- res
			})
			res := <-done
			for i, r := range res {
				if !r.Found || binary.LittleEndian.Uint64(r.Value) != want[i] {
					t.Fatalf("restored key %s: found %v value %x, want %d", keys[i].Record, r.Found, r.Value, want[i])
				}
			}
			t.Logf("%d cold reads in %d batches (mean %.1f keys), %d suspensions, state %d keys restored",
				s.StateMisses, s.ReadBatches, s.MeanReadBatch, s.Suspensions, len(keys))
		})
	}
}
