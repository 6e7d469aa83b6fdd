package server

import (
	"bytes"
	"os"
	goruntime "runtime"
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

// schedSample is the summed run and run-queue wait time of the process's threads, and the
// machine's CPU time (/proc/stat) beside the process's own (/proc/self/stat), in clock ticks.
type schedSample struct {
	run, wait time.Duration
	ok        bool

	hostTotal, hostBusy, self int64 // all CPUs' time, their busy time (steal included), ours
	hostOK                    bool
}

// readSchedstat sums /proc/self/task/*/schedstat (run ns, wait ns, slices), and reads the
// machine's and the process's CPU time (readHostCPU).
func readSchedstat() schedSample {
	var s schedSample
	s.hostTotal, s.hostBusy, s.self, s.hostOK = readHostCPU()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return s
	}
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

// readHostCPU reads the machine's CPU time from /proc/stat's first line (user nice system idle
// iowait irq softirq steal ...: total is their sum, busy all but idle and iowait) and the
// process's own from /proc/self/stat (utime + stime), all in clock ticks.
func readHostCPU() (total, busy, self int64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return 0, 0, 0, false
	}
	for i, v := range f[1:9] { // guest time is already in user and nice
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return 0, 0, 0, false
		}
		total += n
		if i != 3 && i != 4 {
			busy += n
		}
	}
	st, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	i := bytes.LastIndexByte(st, ')') // the command may hold spaces and parentheses
	if i < 0 {
		return 0, 0, 0, false
	}
	sf := bytes.Fields(st[i+1:]) // sf[0] is field 3, the state; utime and stime are 14 and 15
	if len(sf) < 13 {
		return 0, 0, 0, false
	}
	ut, err1 := strconv.ParseInt(string(sf[11]), 10, 64)
	stime, err2 := strconv.ParseInt(string(sf[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, 0, false
	}
	return total, busy, ut + stime, true
}

// hostShare is the part of the CPUs the process may use (GOMAXPROCS of the machine's cpus)
// that the rest of the machine left free over an interval: 1 - what others used (busy time
// not the process's, steal included) over those CPUs' time. ok is false when the interval
// says nothing (no /proc/stat, too few ticks, a counter that went back).
func hostShare(prev, cur schedSample, cpus, procs int) (share float64, ok bool) {
	if !prev.hostOK || !cur.hostOK || cpus <= 0 || procs <= 0 {
		return 0, false
	}
	total, busy, self := cur.hostTotal-prev.hostTotal, cur.hostBusy-prev.hostBusy, cur.self-prev.self
	if total < int64(2*cpus) || busy < 0 || self < 0 { // under 2 ticks a CPU: too coarse
		return 0, false
	}
	others := float64(max(busy-self, 0)) / float64(total) * float64(cpus) // cores others used
	return max(0, min(1, (float64(cpus)-others)/float64(min(cpus, procs)))), true
}

// capacityMeter turns successive samples into the smoothed capacity.
type capacityMeter struct {
	last     schedSample
	capacity float64
	cpus     int // the machine's CPUs and the process's GOMAXPROCS, for hostShare
	procs    int
}

func newCapacityMeter() *capacityMeter {
	return &capacityMeter{capacity: 1, cpus: goruntime.NumCPU(), procs: goruntime.GOMAXPROCS(0)}
}

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
	// Run-queue wait is pressure from the host, or the process's own threads outnumbering the
	// cores (a guest at its one-core share beside the other tenants' request paths). The
	// second is no reason to throttle guests: the running slots already keep a share on its
	// cores, and a scaled share that pauses and resumes costs its neighbours more than a steady
	// one (docs/BENCHMARKS.md, session 7). So capacity is never below what the rest of the
	// machine leaves free.
	if h, ok := hostShare(prev, s, m.cpus, m.procs); ok {
		sample = max(sample, h)
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
