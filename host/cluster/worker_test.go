package cluster

import (
	"slices"
	"testing"
)

// TestGroupMovesOnlyMovedPartitions: two workers share four partitions; a third joins and
// takes some, released with a final checkpoint while the partitions that stay keep running;
// then one leaves and its partitions move to the others.
func TestGroupMovesOnlyMovedPartitions(t *testing.T) {
	c := newTestCluster(t, 4, "")
	spec := c.spec("collect")
	a := c.startWorker(spec)
	b := c.startWorker(c.spec("collect"))
	waitFor(t, "two workers to share the partitions", func() bool { return c.partitioned(a, b) && len(a.w.Owned()) == 2 })
	c.produce(0, 200, 10)
	waitFor(t, "outputs", func() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.outs) >= 200 })
	before := map[*testWorker][]int32{a: a.w.Owned(), b: b.w.Owned()}
	rel0, started0 := len(c.eventsOf(TaskReleased)), len(c.eventsOf(TaskStarted))
	x := c.startWorker(c.spec("collect"))
	// The moved partitions' release events come from the old owners' tasks as they finish,
	// which need not be before the new owner reports them: wait for both.
	lost0 := len(c.eventsOf(TaskLost)) + len(c.eventsOf(TaskFailed))
	waitFor(t, "three workers to share the partitions", func() bool {
		ended := len(c.eventsOf(TaskReleased)) - rel0 + len(c.eventsOf(TaskLost)) + len(c.eventsOf(TaskFailed)) - lost0
		return c.partitioned(a, b, x) && len(x.w.Owned()) >= 1 && ended >= len(x.w.Owned())
	})
	if n := len(c.eventsOf(TaskLost)) + len(c.eventsOf(TaskFailed)); n != 0 {
		t.Fatalf("tasks lost or failed: %v", c.events)
	}
	rel := c.eventsOf(TaskReleased)[rel0:]
	if len(rel) != len(x.w.Owned()) {
		t.Fatalf("released %v, but the new worker owns %v", rel, x.w.Owned())
	}
	for _, e := range rel {
		if !slices.Contains(x.w.Owned(), e.Partition) {
			t.Errorf("partition %d was released but did not move to the new worker", e.Partition)
		}
		if e.Checkpoint == 0 {
			t.Errorf("partition %d released without a final checkpoint", e.Partition)
		}
	}
	for w, ps := range before {
		for _, p := range w.w.Owned() {
			if !slices.Contains(ps, p) {
				t.Errorf("partition %d moved between the old workers", p)
			}
		}
	}
	if n := len(c.eventsOf(TaskLost)) + len(c.eventsOf(TaskFailed)); n != 0 {
		t.Fatalf("tasks lost or failed: %v", c.events)
	}
	// Tasks of partitions that stayed were never restarted: one start per moved partition.
	waitFor(t, "the moved tasks to start", func() bool { return len(c.eventsOf(TaskStarted))-started0 >= len(rel) })
	if got, want := len(c.eventsOf(TaskStarted))-started0, len(rel); got != want {
		t.Errorf("%d task starts, want %d", got, want)
	}
	gone := a.w.Owned()
	a.stop(t)
	waitFor(t, "the leaver's partitions to move", func() bool { return c.partitioned(b, x) })
	for _, p := range gone {
		if !slices.Contains(b.w.Owned(), p) && !slices.Contains(x.w.Owned(), p) {
			t.Errorf("partition %d not taken over", p)
		}
	}
}
