package scheduler

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// syncBuffer is a bytes.Buffer a logger may write to from any goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestInstanceBudget: every read is cold, so each admitted record suspends holding an
// instance. A budget below two instances' footprint keeps one instance, the rest wait for it
// without one (and the controller says so, once); a large budget lets many run at once. Both
// runs give the same per-key counts.
func TestInstanceBudget(t *testing.T) {
	m := loadModule(t, "testdata/accum.wasm")
	run := func(budget int64) (Snapshot, string, []out) {
		var snap Snapshot
		var logs syncBuffer
		var outs []out
		synctest.Test(t, func(t *testing.T) {
			tier := newFakeTier(3, time.Millisecond, 3*time.Millisecond, 0)
			sink := &collectSink{}
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			c, err := New(m, tier, sink, WithMaxInFlight(32), WithInstanceMemoryBudget(budget), WithLogger(log),
				WithExecMode(ExecDirect))
			if err != nil {
				t.Fatal(err)
			}
			w := genWorkload(rand.New(rand.NewPCG(7, 7)), 400, 50)
			if err := c.Run(context.Background(), feed(w.elems, 16)); err != nil {
				t.Fatal(err)
			}
			tier.pending.Wait()
			snap = c.Metrics()
			outs = sink.outs
		})
		return snap, logs.String(), outs
	}
	small, smallLog, smallOuts := run(1)
	if small.PeakInstances != 1 || small.InstanceWaits == 0 {
		t.Errorf("budget 1 B: peak %d instances, %d waits; want 1 instance and some waits", small.PeakInstances, small.InstanceWaits)
	}
	if n := strings.Count(smallLog, "instance budget reached"); n != 1 {
		t.Errorf("budget 1 B: %d 'instance budget reached' lines, want 1:\n%s", n, smallLog)
	}
	for _, want := range []string{"controller started", "controller stopped", `operator=`} {
		if !strings.Contains(smallLog, want) {
			t.Errorf("log lacks %q:\n%s", want, smallLog)
		}
	}
	large, largeLog, largeOuts := run(1 << 30)
	if large.PeakInstances < 2 || large.InstanceWaits != 0 {
		t.Errorf("budget 1 GiB: peak %d instances, %d waits; want several and none", large.PeakInstances, large.InstanceWaits)
	}
	if strings.Contains(largeLog, "instance budget reached") {
		t.Errorf("budget 1 GiB logged the budget:\n%s", largeLog)
	}
	if got, want := perKeyLast(smallOuts), perKeyLast(largeOuts); len(got) == 0 || !equalMaps(got, want) {
		t.Errorf("outputs differ between budgets: %d keys vs %d", len(got), len(want))
	}
}

func perKeyLast(outs []out) map[string]string {
	m := map[string]string{}
	for _, o := range outs {
		if o.kind == OutputData {
			m[o.key] = string(o.value)
		}
	}
	return m
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestInstanceOverhead(t *testing.T) {
	for _, tc := range []struct {
		name        string
		growth, mem int64
		onHeap      bool
		want        int64
	}{
		{"heap memory is subtracted", 5 << 20, 4 << 20, true, 1 << 20},
		{"mapped memory is not", 5 << 20, 4 << 20, false, 5 << 20},
		{"the floor", 10 << 10, 4 << 20, false, minInstanceOverhead},
		{"the floor after subtracting", 4<<20 + 1, 4 << 20, true, minInstanceOverhead},
	} {
		if got := instanceOverhead(tc.growth, tc.mem, tc.onHeap); got != tc.want {
			t.Errorf("%s: instanceOverhead(%d, %d, %v) = %d, want %d", tc.name, tc.growth, tc.mem, tc.onHeap, got, tc.want)
		}
	}
}

// TestGoGuestOverheadCounted: a Go guest's linear memory (megabytes) lives in its own mapping on
// Linux, so it is not part of the heap growth that measures wazero's per-instance structures.
// Subtracting it anyway put the overhead at its 32 KiB floor, under-counting every Go instance.
func TestGoGuestOverheadCounted(t *testing.T) {
	m := loadModule(t, counterGo)
	c, err := New(m, newFakeTier(1, 0, 0, 0), &collectSink{})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan []Element)
	close(in)
	if err := c.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS != "linux" {
		t.Skip("linear memory is on the Go heap outside Linux")
	}
	mem := c.nextCost - c.overhead // a mapped memory counts as its size
	if c.overhead <= minInstanceOverhead {
		t.Errorf("Go guest: overhead %d B (the floor), linear memory %d B: wazero's structures were not counted", c.overhead, mem)
	}
	t.Logf("Go guest: linear memory %d KiB, overhead %d KiB", mem>>10, c.overhead>>10)
}

// TestInstanceBudgetKeyOrder: with a budget of a few instances, records wait for one; two
// records of one key that both waited must not run side by side once instances free (the
// second parks behind the first in the gate). Half the reads go cold again (eviction). Every
// key's count comes out as with an unlimited budget, and each key's outputs count up one by one.
func TestInstanceBudgetKeyOrder(t *testing.T) {
	m := loadModule(t, "testdata/accum.wasm")
	var budget, cost int64 // of the last run
	run := func(budgetFor func(cost int64) int64) (Snapshot, []out) {
		probe, err := New(m, newFakeTier(1, 0, 0, 0), &collectSink{})
		if err != nil {
			t.Fatal(err)
		}
		if err := probe.Run(context.Background(), feed(nil, 1)); err != nil {
			t.Fatal(err)
		}
		tier := newFakeTier(3, 100*time.Microsecond, time.Millisecond, 0.5)
		sink := &collectSink{}
		budget = budgetFor(probe.nextCost)
		c, err := New(m, tier, sink, WithMaxInFlight(32), WithInstanceMemoryBudget(budget), WithExecMode(ExecDirect))
		if err != nil {
			t.Fatal(err)
		}
		w := genWorkload(rand.New(rand.NewPCG(9, 9)), 600, 8)
		if err := c.Run(context.Background(), feed(w.elems, 16)); err != nil {
			t.Fatal(err)
		}
		tier.pending.Wait()
		cost = c.nextCost // each controller measures it; under -race it varies between runs
		return c.Metrics(), sink.outs
	}
	small, smallOuts := run(func(cost int64) int64 { return 3*cost + cost/2 })
	if allowed := max(budget/cost, 1); small.PeakInstances > allowed || small.PeakInstances < min(allowed, 2) || small.InstanceWaits == 0 {
		t.Errorf("budget of %d B at %d B per instance: peak %d, %d waits", budget, cost, small.PeakInstances, small.InstanceWaits)
	}
	for _, o := range smallOuts {
		// accum emits [i, n]: the record's per-key index and the count it read; equal when
		// every record of the key ran after the one before it.
		if o.kind == OutputData && len(o.value) == 16 && string(o.value[:8]) != string(o.value[8:]) {
			t.Fatalf("key %s: record %x read count %x (records of one key ran side by side)", o.key, o.value[:8], o.value[8:])
		}
	}
	_, largeOuts := run(func(int64) int64 { return 1 << 30 })
	if got, want := perKeyLast(smallOuts), perKeyLast(largeOuts); len(got) == 0 || !equalMaps(got, want) {
		t.Errorf("per-key results differ from an unlimited budget: %v vs %v", got, want)
	}
}
