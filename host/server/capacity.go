package server

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// # Guest shares under CPU pressure
//
// A tenant's guest_cpu_millicores is a share of cores the host is assumed to have. A host that
// does not get its cores (a VM whose neighbours are busy, a container's CPU limit, a kernel
// that gives each session a fair slice of the machine) cannot give them: a tenant at its
// one-core share then takes the CPU that every tenant's host work (ingest, routing, sinks,
// their own guests) needs, and BenchmarkNoisyNeighbour measured the neighbour at a third of its
// throughput (docs/BENCHMARKS.md, "Issue 14").
//
// So the server measures the pressure on its own threads and scales every tenant's share by
// it: capacity is the fraction of the time its threads were runnable that they actually ran
// (/proc/self/task/*/schedstat, run and run-queue wait), smoothed, sampled every
// capacityEvery. A share of q cores runs at q × capacity. On a host that has its cores the
// threads hardly wait and capacity stays 1; under pressure guests, the elastic part of the
// work, give way first, each tenant in proportion to its quota. A tenant's guest time then
// approaches capacity² × q of real CPU (its runnable time shrinks and so does what it gets of
// it), which leaves the host's request paths what they need; the tenant view's cpu panel shows
// the quota, the capacity and the effective cores. Where schedstat is missing (not Linux, or a
// kernel without it) capacity is 1.

const (
	capacityEvery = 100 * time.Millisecond
	minCapacity   = 0.05 // never throttle guests below a twentieth of their quota
	capacityAlpha = 0.3  // the weight of a new sample in the smoothed capacity
	minSampled    = 5 * time.Millisecond
)

// schedSample is the summed run and run-queue wait time of the process's threads.
type schedSample struct {
	run, wait time.Duration
	ok        bool
}

// readSchedstat sums /proc/self/task/*/schedstat (run ns, wait ns, slices).
func readSchedstat() schedSample {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return schedSample{}
	}
	var s schedSample
	for _, e := range ents {
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/schedstat")
		if err != nil {
			continue // a thread that ended meanwhile
		}
		f := bytes.Fields(b)
		if len(f) < 2 {
			continue
		}
		run, err1 := strconv.ParseInt(string(f[0]), 10, 64)
		wait, err2 := strconv.ParseInt(string(f[1]), 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		s.run += time.Duration(run)
		s.wait += time.Duration(wait)
		s.ok = true
	}
	return s
}

// capacityMeter turns successive samples into the smoothed capacity.
type capacityMeter struct {
	last     schedSample
	capacity float64
}

func newCapacityMeter() *capacityMeter { return &capacityMeter{capacity: 1} }

// observe takes a sample and returns the capacity. Threads that ended between two samples take
// their times with them, so a delta can be negative: it is skipped, as is an interval with too
// little runnable time to say anything (an idle server keeps its last capacity, drifting back
// to 1 as it stays idle).
func (m *capacityMeter) observe(s schedSample) float64 {
	prev := m.last
	m.last = s
	if !s.ok || !prev.ok {
		return m.capacity
	}
	run, wait := s.run-prev.run, s.wait-prev.wait
	if run < 0 || wait < 0 {
		return m.capacity
	}
	sample := 1.0
	if run+wait >= minSampled {
		sample = float64(run) / float64(run+wait)
	}
	m.capacity = max(minCapacity, min(1, (1-capacityAlpha)*m.capacity+capacityAlpha*sample))
	return m.capacity
}

// capacityLoop samples the capacity and re-scales the tenants' shares, until the runtime closes.
func (rt *runtime) capacityLoop(sample func() schedSample) {
	defer rt.wg.Done()
	m := newCapacityMeter()
	m.observe(sample())
	t := time.NewTicker(capacityEvery)
	defer t.Stop()
	for {
		select {
		case <-rt.ctx.Done():
			return
		case <-t.C:
		}
		rt.setCapacity(m.observe(sample()))
	}
}

// setCapacity scales every tenant's share to capacity (skipping changes under 2 %, which
// would only wake paused guests for nothing).
func (rt *runtime) setCapacity(capacity float64) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	old := rt.capacity
	if capacity == old || (capacity != 1 && capacity/old > 0.98 && capacity/old < 1.02) {
		return
	}
	rt.capacity = capacity
	for tenant, sh := range rt.shares {
		sh.SetCores(float64(rt.shareQuota[tenant]) / 1000 * rt.capacity)
	}
}
