package state

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"
)

// TestCaptureGenerations captures several deltas before any persists, rewriting the same keys
// in between (in place, larger, deleted, put again), and checks that each checkpoint restores
// exactly the state at its capture: every persist reads its own generation's values while the
// runner writes the next ones (see entry).
func TestCaptureGenerations(t *testing.T) {
	const keys, rounds = 300, 6
	s := openTest(t, "mem://generations-"+randomHex(4), WithHotBytes(0))
	b := operator(t, s, OperatorOptions{Name: "gen"})
	rng := rand.New(rand.NewPCG(4, 2))
	model := map[int]string{}
	var models []map[int]string
	var snaps []Snapshot
	for r := range rounds {
		for range keys {
			i := rng.IntN(keys)
			switch rng.IntN(5) {
			case 0:
				b.Delete(key(0, fmt.Sprint(i), ""))
				delete(model, i)
			case 1: // larger than before: a new buffer
				v := fmt.Sprintf("round %d key %d with a longer value %d", r, i, rng.IntN(1e6))
				b.Put(key(0, fmt.Sprint(i), ""), []byte(v))
				model[i] = v
			default: // same size: written in place when no snapshot reads the old value
				v := fmt.Sprintf("r%d-%04d", r, i)
				b.Put(key(0, fmt.Sprint(i), ""), []byte(v))
				model[i] = v
			}
		}
		snap, err := b.Capture(uint64(r + 1))
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, snap)
		m := make(map[int]string, len(model))
		for k, v := range model {
			m[k] = v
		}
		models = append(models, m)
		// Sometimes let the earlier persists run while the runner goes on writing.
		if r == 2 {
			if err := snaps[1].Persist(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := snaps[len(snaps)-1].Persist(context.Background()); err != nil {
		t.Fatal(err)
	}
	for r := range rounds {
		rb := operator(t, s, OperatorOptions{Name: "gen", RestoreFrom: uint64(r + 1)})
		for i := range keys {
			v, ok := read(t, rb, key(0, fmt.Sprint(i), ""))
			want, wok := models[r][i]
			if ok != wok || string(v) != want {
				t.Fatalf("checkpoint %d key %d: got %q (found %v), want %q (found %v)", r+1, i, v, ok, want, wok)
			}
		}
		rb.Close()
	}
}

// switchStore fails every segment put while failing is set.
type switchStore struct {
	objectStore
	failing atomic.Bool
	failed  atomic.Int64
}

func (f *switchStore) put(ctx context.Context, name string, data []byte, c putCond) (string, error) {
	if f.failing.Load() && strings.Contains(name, "/segments/") {
		f.failed.Add(1)
		return "", &Error{Op: "put", Object: name, Retryable: true, Err: errors.New("injected")}
	}
	return f.objectStore.put(ctx, name, data, c)
}

// TestFailedSpillsCarried: spills whose segment puts fail after they were readable, while
// their entries were evicted. Reads of those keys are served from the segments kept in memory,
// the next delta to persist writes them again, and a checkpoint then restores exactly the
// written state, with nothing left in memory.
func TestFailedSpillsCarried(t *testing.T) {
	const budget = 32 << 10
	s := openTest(t, "mem://carried-"+randomHex(4), WithHotBytes(budget))
	sw := &switchStore{objectStore: s.os}
	s.os = sw
	b := operator(t, s, OperatorOptions{Name: "carry"})
	model := map[string]string{}
	put := func(k, v string) {
		b.Put(key(0, k, ""), []byte(v))
		model[k] = v
	}
	for i := range 500 {
		put(fmt.Sprint("a", i), fmt.Sprint("first ", i))
	}
	checkpoint(t, b, 1)
	sw.failing.Store(true)
	for i := range 3000 {
		put(fmt.Sprint("k", i), fmt.Sprint("value of k", i))
		if i%7 == 0 {
			put(fmt.Sprint("a", i%500), fmt.Sprint("second ", i))
		}
	}
	// Let every spill in flight fail.
	for len(b.run.pending) > 0 {
		<-b.run.pending[len(b.run.pending)-1].done
		b.observe()
	}
	if sw.failed.Load() == 0 || b.Metrics().Spills == 0 {
		t.Fatalf("no spill failed (%d failed puts, %d spills)", sw.failed.Load(), b.Metrics().Spills)
	}
	b.mu.Lock()
	carried := 0
	for _, m := range b.mu.mem {
		if m.carried {
			carried++
		}
	}
	b.mu.Unlock()
	if carried == 0 || b.run.memBytes == 0 {
		t.Fatalf("nothing carried in memory (%d segments, %d bytes)", carried, b.run.memBytes)
	}
	check := func(b *Tiered, what string) {
		t.Helper()
		for k, want := range model {
			v, ok := read(t, b, key(0, k, ""))
			if !ok || string(v) != want {
				t.Fatalf("%s: %s = %q (found %v), want %q", what, k, v, ok, want)
			}
		}
	}
	check(b, "while carried")
	sw.failing.Store(false)
	for i := range 200 {
		put(fmt.Sprint("z", i), "after")
	}
	checkpoint(t, b, 2)
	b.observe()
	b.mu.Lock()
	left := len(b.mu.mem)
	b.mu.Unlock()
	if left != 0 || b.run.memBytes != 0 {
		t.Fatalf("after a committed checkpoint %d segments (%d bytes) are still in memory", left, b.run.memBytes)
	}
	check(b, "after the checkpoint")
	rb := operator(t, s, OperatorOptions{Name: "carry", RestoreFrom: 2})
	check(rb, "restored")
}

// TestEntrySize: an entry is one 128-byte size class (its key and a counter's value inline);
// a field added carelessly makes every hot key cost a size class more.
func TestEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 128 {
		t.Fatalf("entry is %d bytes, want 128", n)
	}
}
