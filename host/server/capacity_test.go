package server

import (
	"math"
	"os"
	goruntime "runtime"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
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

// TestCapacityLoopScalesShares: the sampling loop turns the threads' run and wait times into
// the tenants' shares (a fake sampler under synctest's clock: threads running a quarter of
// their runnable time), and stops with the runtime.
func TestCapacityLoopScalesShares(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := openEnv(t, t.TempDir(), func(c *Config) { c.FixedCPUShares = true })
		rt := e.srv.rt
		sh := rt.share("a", 2000)
		var mu sync.Mutex
		var cur schedSample
		sample := func() schedSample {
			mu.Lock()
			defer mu.Unlock()
			cur = schedSample{run: cur.run + 25*time.Millisecond, wait: cur.wait + 75*time.Millisecond, ok: true}
			return cur
		}
		rt.wg.Add(1)
		go rt.capacityLoop(sample)
		time.Sleep(50 * capacityEvery)
		synctest.Wait()
		if c := sh.Cores(); math.Abs(c-2*0.25) > 0.01 {
			t.Fatalf("at a quarter of the runnable time: %v cores, want ~0.5 (2 cores × 0.25)", c)
		}
	})
}

// TestReadSchedstat: on Linux the process's own threads have run (a kernel without schedstat
// reports ok false and the capacity stays 1).
func TestReadSchedstat(t *testing.T) {
	if goruntime.GOOS != "linux" {
		t.Skip("schedstat is Linux's")
	}
	s := readSchedstat()
	if _, err := os.Stat("/proc/self/task/" + strconv.Itoa(os.Getpid()) + "/schedstat"); err != nil {
		if s.ok {
			t.Fatal("no schedstat file, yet a sample")
		}
		t.Skip("this kernel has no schedstat")
	}
	if !s.ok || s.run <= 0 || s.wait < 0 {
		t.Fatalf("sample %+v: want the threads' run time", s)
	}
}

// TestHostShare: the part of the process's CPUs the rest of the machine leaves free, from
// /proc/stat's busy time (steal included) less the process's own.
func TestHostShare(t *testing.T) {
	host := func(total, busy, self int64) schedSample {
		return schedSample{hostTotal: total, hostBusy: busy, self: self, hostOK: true}
	}
	zero := host(0, 0, 0)
	for _, c := range []struct {
		name              string
		total, busy, self int64
		cpus, procs       int
		want              float64
		ok                bool
	}{
		{"quiet host, the process busy", 200, 150, 150, 2, 2, 1, true},
		{"others use one of two cores", 200, 150, 50, 2, 2, 0.5, true},
		{"others use one core, we may use one", 200, 150, 50, 2, 1, 1, true},
		{"others use both cores", 200, 200, 0, 2, 2, 0, true},
		{"too few ticks to tell", 3, 3, 0, 2, 2, 0, false},
		{"a counter went back", 200, -1, 0, 2, 2, 0, false},
	} {
		got, ok := hostShare(zero, host(c.total, c.busy, c.self), c.cpus, c.procs)
		if ok != c.ok || (ok && math.Abs(got-c.want) > 1e-9) {
			t.Errorf("%s: hostShare = %v, %v; want %v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
	if _, ok := hostShare(schedSample{}, host(200, 100, 100), 2, 2); ok {
		t.Error("a share from a missing /proc/stat sample")
	}
}

// TestCapacityFollowsHostNotSelf: run-queue wait of the process's own threads on an otherwise
// idle host leaves the capacity at 1 (the process's threads ran a third of their runnable
// time, but nobody else used the CPUs); with the rest of the machine using half the CPUs, the
// capacity converges to the larger of the two readings.
func TestCapacityFollowsHostNotSelf(t *testing.T) {
	ms := time.Millisecond
	m := newCapacityMeter()
	m.cpus, m.procs = 2, 2
	cur := schedSample{ok: true, hostOK: true}
	step := func(run, wait time.Duration, total, busy, self int64) float64 {
		cur.run, cur.wait = cur.run+run, cur.wait+wait
		cur.hostTotal, cur.hostBusy, cur.self = cur.hostTotal+total, cur.hostBusy+busy, cur.self+self
		return m.observe(cur)
	}
	step(0, 0, 0, 0, 0)
	var c float64
	for range 40 {
		c = step(30*ms, 60*ms, 20, 18, 18) // busy is all ours
	}
	if c < 0.999 {
		t.Fatalf("idle host, own threads contended: capacity %v, want ~1", c)
	}
	for range 40 {
		c = step(30*ms, 60*ms, 20, 20, 10) // others take half the CPUs
	}
	if math.Abs(c-0.5) > 1e-3 {
		t.Fatalf("others use half the CPUs: capacity %v, want 0.5 (max of 1/3 and 1/2)", c)
	}
	for range 40 {
		c = step(20*ms, 80*ms, 20, 20, 10)
	}
	if math.Abs(c-0.5) > 1e-3 {
		t.Fatalf("a fifth of runnable time, others half: capacity %v, want 0.5", c)
	}
}

// TestReadHostCPU: on Linux /proc/stat and /proc/self/stat give the machine's and the
// process's CPU time, the process's within the machine's busy time.
func TestReadHostCPU(t *testing.T) {
	if goruntime.GOOS != "linux" {
		t.Skip("/proc/stat is Linux's")
	}
	var total, busy, self int64
	ok := false
	x := 0
	for round := 0; round < 200 && self == 0; round++ { // until our CPU time shows (a tick is 10 ms)
		for i := 0; i < 10_000_000; i++ {
			x += i & 3
		}
		total, busy, self, ok = readHostCPU()
		if !ok {
			t.Fatal("readHostCPU found no /proc/stat or /proc/self/stat")
		}
	}
	if total <= 0 || busy <= 0 || busy > total || self <= 0 || x == 0 {
		t.Fatalf("readHostCPU = total %d busy %d self %d", total, busy, self)
	}
}
