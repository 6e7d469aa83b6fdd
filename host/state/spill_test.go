package state

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
)

// TestSpillBoundsDirty writes far more distinct keys than the hot tier holds, with no
// checkpoint in between. Dirty entries cannot be evicted, so without spilling the tier would
// hold every one of them. With it, the tier stays within its budget after every write, reads
// of spilled keys (evicted since) come back from the pool, and a checkpoint restores exactly
// the written state, spilled deltas included, overwrites and deletes winning over older spills.
func TestSpillBoundsDirty(t *testing.T) {
	for _, url := range []string{"mem://" + randomHex(8), "file://" + t.TempDir()} {
		t.Run(strings.SplitN(url, ":", 2)[0], func(t *testing.T) {
			const budget = 64 << 10
			s := openTest(t, url, WithFsync(false), WithHotBytes(budget))
			b := operator(t, s, OperatorOptions{Name: "sp"})
			model := map[string]string{}
			val := strings.Repeat("v", 60)
			maxEntry := int64(len(val)+64) + entryOverhead
			peak := int64(0)
			write := func(k, v string) {
				if v == "" {
					b.Delete(key(0, k, ""))
					delete(model, k)
				} else {
					b.Put(key(0, k, ""), []byte(v))
					model[k] = v
				}
				peak = max(peak, b.run.bytes)
				if b.run.bytes > budget+2*maxEntry {
					t.Fatalf("after %d keys the hot tier holds %d bytes (%d dirty), budget %d", len(model), b.run.bytes, b.run.dirtyBytes, budget)
				}
			}
			for i := range 8000 {
				write(fmt.Sprint("k", i), fmt.Sprint(val, i))
			}
			// Overwrite and delete keys that went out in early spills: the newer value must
			// win over the spilled one, before and after the checkpoint.
			for i := 0; i < 8000; i += 97 {
				if i%2 == 0 {
					write(fmt.Sprint("k", i), fmt.Sprint("new", i))
				} else {
					write(fmt.Sprint("k", i), "")
				}
			}
			m := b.Metrics()
			if m.Spills < 5 || m.SpillBytes == 0 {
				t.Fatalf("%d spills (%d bytes) for %d bytes of distinct keys in a %d-byte tier", m.Spills, m.SpillBytes, 8000*maxEntry, budget)
			}
			check := func(r *Tiered, when string) {
				t.Helper()
				for _, i := range []int{0, 1, 97, 50 * 97, 5000, 7999} {
					k := fmt.Sprint("k", i)
					v, ok := read(t, r, key(0, k, ""))
					w, wok := model[k]
					if ok != wok || string(v) != w {
						t.Fatalf("%s: %s = %q,%v want %q,%v", when, k, v, ok, w, wok)
					}
				}
			}
			check(b, "before the checkpoint")
			checkpoint(t, b, 1)
			check(b, "after the checkpoint")
			b.Close()

			r := operator(t, s, OperatorOptions{Name: "sp", RestoreFrom: 1})
			checkAll(t, r, 0, "", 8000, model, "restored")
			t.Logf("%d spills, %d bytes; peak hot %d of %d", m.Spills, m.SpillBytes, peak, budget)
		})
	}
}

// TestSpillThenCheckpointChain: spills between several checkpoints, each checkpoint adopting
// only the spills captured before it; restoring each gives the state at its cut.
func TestSpillThenCheckpointChain(t *testing.T) {
	const budget = 32 << 10
	s := openTest(t, "mem://"+randomHex(8), WithHotBytes(budget))
	b := operator(t, s, OperatorOptions{Name: "sc"})
	cuts := map[uint64]map[string]string{}
	model := map[string]string{}
	for c := uint64(1); c <= 4; c++ {
		for i := range 3000 {
			k := fmt.Sprint("k", (int(c)*1000+i)%6000)
			v := fmt.Sprint("c", c, "-", i, strings.Repeat(".", 40))
			b.Put(key(1, k, "e"), []byte(v))
			model[k] = v
		}
		snap, err := b.Capture(c)
		if err != nil {
			t.Fatal(err)
		}
		cuts[c] = maps(model)
		// Persist late, from another goroutine, while the next round's spills pile up
		// behind it: spill must persist it first (in order), not deadlock or reorder.
		done := make(chan error, 1)
		go func() { done <- snap.Persist(context.Background()) }()
		if c%2 == 0 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		} else {
			defer func() {
				if err := <-done; err != nil {
					t.Error(err)
				}
			}()
		}
	}
	checkpoint(t, b, 5)
	cuts[5] = maps(model)
	if b.Metrics().Spills == 0 {
		t.Fatal("nothing spilled")
	}
	b.Close()
	for id, want := range cuts {
		r := operator(t, s, OperatorOptions{Name: "sc", RestoreFrom: id})
		checkAll(t, r, 1, "e", 6000, want, fmt.Sprint("checkpoint ", id))
		r.Close()
	}
}

func maps(m map[string]string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// checkAll compares keys k0..k(n-1) of state st with model, fetching the cold ones in one batch.
func checkAll(t *testing.T, r *Tiered, st int, ent string, n int, model map[string]string, what string) {
	t.Helper()
	var cold []Key
	for i := range n {
		k := fmt.Sprint("k", i)
		v, ok, hot := r.Get(key(st, k, ent))
		if !hot {
			cold = append(cold, key(st, k, ent))
			continue
		}
		if w, wok := model[k]; ok != wok || string(v) != w {
			t.Fatalf("%s: hot %s = %q,%v want %q,%v", what, k, v, ok, w, wok)
		}
	}
	f, err := fetchSync(t, r, cold)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range f {
		k := string(x.Key.Record)
		if w, wok := model[k]; x.Found != wok || string(x.Value) != w {
			t.Fatalf("%s: %s = %q,%v want %q,%v", what, k, x.Value, x.Found, w, wok)
		}
	}
}

// TestCapturesFasterThanPersists: checkpoints captured and never persisted by the caller (a
// pool slower than the checkpoint interval) must not pin one delta each beyond the budget:
// Capture persists and waits for the older ones first.
func TestCapturesFasterThanPersists(t *testing.T) {
	const budget = 32 << 10
	s := openTest(t, "mem://"+randomHex(8), WithHotBytes(budget))
	b := operator(t, s, OperatorOptions{Name: "cf"})
	model := map[string]string{}
	maxEntry := int64(64+40) + entryOverhead
	var snaps []Snapshot
	for c := uint64(1); c <= 40; c++ {
		for i := range 100 {
			k := fmt.Sprint("k", int(c)*100+i)
			v := fmt.Sprint(c, strings.Repeat("x", 30))
			b.Put(key(0, k, ""), []byte(v))
			model[k] = v
		}
		snap, err := b.Capture(c)
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, snap)
		if b.run.bytes > budget+2*maxEntry {
			t.Fatalf("after checkpoint %d the tier holds %d bytes (%d pinned by %d pending), budget %d", c, b.run.bytes, b.run.pinnedOut, len(b.run.pending), budget)
		}
	}
	for _, s := range snaps {
		if err := s.Persist(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	b.Close()
	r := operator(t, s, OperatorOptions{Name: "cf", RestoreFrom: 40})
	checkAll(t, r, 0, "", 4100, model, "restored")
}

// TestSpillWaitsOnlyWhenFull: while the pool takes no PUT, spills still become readable (their
// segments are held in memory), so the runner writes on until what it cannot evict (pending
// deltas and the dirty entries) fills the budget, and only then waits. It waited before at each
// spill's capture for room for the whole next delta, so with two-thirds of the budget pinned,
// and in a run at a tenth hot for nearly every spill (the one before not yet encoded). Once the
// PUTs go through, every write lands and a checkpoint restores them all.
func TestSpillWaitsOnlyWhenFull(t *testing.T) { synctest.Test(t, testSpillWaitsOnlyWhenFull) }

func testSpillWaitsOnlyWhenFull(t *testing.T) {
	const budget = 48 << 10
	s := openTest(t, "mem://"+randomHex(8), WithHotBytes(budget), WithMaxSegments(1<<20))
	gate := &gatedPuts{objectStore: s.os, open: make(chan struct{})}
	s.os = gate
	b := operator(t, s, OperatorOptions{Name: "full"})
	gate.on.Store(true)
	val := strings.Repeat("v", 60)
	maxEntry := int64(len(val)+64) + entryOverhead
	const n = 20000
	var written atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			b.Put(key(0, fmt.Sprint("k", i), ""), []byte(fmt.Sprint(val, i)))
			written.Add(1)
		}
	}()
	synctest.Wait() // the writer waits for a PUT, or is done
	select {
	case <-done:
		t.Fatalf("all %d writes landed with no PUT taken: the budget does not bound them", n)
	default:
	}
	// The writer is durably blocked, inside a write: the bubble orders its state before here.
	unevictable := b.run.pinnedOut + b.run.dirtyBytes
	if unevictable <= budget || unevictable > budget+maxEntry {
		t.Fatalf("the writer waits with %d bytes pinned or dirty (%d pending deltas, %d written), budget %d: want it to wait only once they fill the budget", unevictable, len(b.run.pending), written.Load(), budget)
	}
	if used := b.run.bytes + b.run.memBytes; used > budget+2*maxEntry {
		t.Fatalf("the tier holds %d bytes, budget %d", used, budget)
	}
	close(gate.open)
	<-done
	checkpoint(t, b, 1)
	b.Close()
	model := map[string]string{}
	for i := range n {
		model[fmt.Sprint("k", i)] = fmt.Sprint(val, i)
	}
	r := operator(t, s, OperatorOptions{Name: "full", RestoreFrom: 1})
	checkAll(t, r, 0, "", n, model, "restored")
}

// gatedPuts holds every PUT, once on, until open is closed.
type gatedPuts struct {
	objectStore
	on   atomic.Bool
	open chan struct{}
}

func (g *gatedPuts) put(ctx context.Context, name string, data []byte, c putCond) (string, error) {
	if !g.on.Load() {
		return g.objectStore.put(ctx, name, data, c)
	}
	select {
	case <-g.open:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return g.objectStore.put(ctx, name, data, c)
}
