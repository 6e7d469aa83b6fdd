package server

import (
	"math"
	"testing"
	"time"
)

// TestCapacityMeter: the capacity is the smoothed fraction of runnable time the threads ran;
// intervals too short to tell, missing samples and negative deltas (threads that ended) keep
// it; it never falls below minCapacity nor rises above 1.
func TestCapacityMeter(t *testing.T) {
	ms := time.Millisecond
	m := newCapacityMeter()
	at := func(run, wait time.Duration) schedSample { return schedSample{run: run, wait: wait, ok: true} }
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-4 {
			t.Fatalf("%s: capacity %v, want %v", what, got, want)
		}
	}
	near("first sample", m.observe(at(100*ms, 100*ms)), 1)
	// 30 ms run of 100 ms runnable: 0.7×1 + 0.3×0.3.
	near("contended", m.observe(at(130*ms, 170*ms)), 0.79)
	c := 0.79
	for range 40 { // a long contention converges on the sampled fraction
		c = m.observe(at(m.last.run+30*ms, m.last.wait+70*ms))
	}
	if math.Abs(c-0.3) > 1e-4 {
		t.Fatalf("converged: capacity %v, want 0.3", c)
	}
	near("too short to tell", m.observe(at(m.last.run+ms, m.last.wait+ms)), 0.7*0.3+0.3*1)
	c = m.capacity
	near("a thread ended", m.observe(at(m.last.run-50*ms, m.last.wait)), c)
	near("no schedstat", m.observe(schedSample{}), c)
	near("after a missing sample", m.observe(at(time.Second, time.Second)), c)
	for range 100 {
		m.observe(at(m.last.run, m.last.wait+100*ms)) // threads that never run
	}
	near("floor", m.capacity, minCapacity)
	for range 100 {
		m.observe(at(m.last.run+100*ms, m.last.wait))
	}
	if m.capacity < 0.999 || m.capacity > 1 {
		t.Fatalf("uncontended: capacity %v, want ~1", m.capacity)
	}
}

// TestSharesFollowCapacity: each tenant's share is its quota times the host's capacity, for a
// share created before the capacity changed and for one created after; changes under 2 % are
// not applied; back at 1 the quotas hold as configured.
func TestSharesFollowCapacity(t *testing.T) {
	e := openEnv(t, t.TempDir(), func(c *Config) { c.FixedCPUShares = true }) // no sampler: the test sets the capacity
	rt := e.srv.rt
	a := rt.share("a", 1000)
	rt.setCapacity(0.5)
	b := rt.share("b", 250)
	if a.Cores() != 0.5 || b.Cores() != 0.125 {
		t.Fatalf("at capacity 0.5: a %v b %v cores, want 0.5 and 0.125", a.Cores(), b.Cores())
	}
	rt.setCapacity(0.505)
	if a.Cores() != 0.5 {
		t.Fatalf("a 1%% change was applied: %v", a.Cores())
	}
	rt.setCapacity(1)
	if a.Cores() != 1 || b.Cores() != 0.25 {
		t.Fatalf("at capacity 1: a %v b %v cores", a.Cores(), b.Cores())
	}
	rt.share("a", 0) // unlimited stays unlimited
	rt.setCapacity(0.3)
	if a.Cores() != 0 {
		t.Fatalf("an unlimited share became %v cores", a.Cores())
	}
}
