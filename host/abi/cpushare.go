package abi

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// # CPU shares
//
// A guest that computes without returning keeps its goroutine, and so one of GOMAXPROCS
// processors, until Go preempts it (every 10 ms): a neighbour's goroutines (an HTTP handler, a
// source, another tenant's operator) wait that long for each hop. Two things bound what a
// busy guest takes from others:
//
//   - Every fuel check yields the processor (runtime.Gosched): a busy guest takes turns with
//     whatever else is runnable at each check (at least every watchdog period, and every fuel
//     refill, ~1-10 ms of a tight loop) instead of holding it for a whole preemption slice.
//     Short calls pay nothing for it: a call that returns within its refill reaches a check only
//     when the watchdog forces one, at most once per watchdog period per instance (the
//     AssemblyScript counter made 3 checks in 200,000 records, 10 s call limit), or every
//     cpuSharePeriod with a share. A Gosched with nothing else runnable returns at once.
//   - A CPUShare, shared by the engines of one tenant, bounds their guests' execution time to
//     Cores cores on average: each call's running time is charged to it (at each fuel check
//     and when the call returns), and a call that finds the share overdrawn pauses, off the
//     processor, until the share is back in credit. Paused time does not count against the
//     call's time limit. Engines with a share force a fuel check at least every
//     cpuSharePeriod.
//
//   - A share also bounds how many of its guests run at the same instant: at most ⌈Cores⌉
//     (at least one). Without it, a share of one core over two subtasks lets both run at once
//     for a period and then pause both: on average one core, but a neighbour that needs a
//     processor meanwhile finds none, and every hop of its pipeline waits for the next fuel
//     check's yield. With it, a share of one core keeps one processor free on a two-core host
//     at every instant. A call holds its running slot from its start to its return, and gives
//     it up while it is suspended in an async import (NoteSuspended, NoteResumed) and while
//     the host blocks inside it (Blocking: an emit that waits for a full downstream channel),
//     so a guest waiting on its tenant's other operators never holds the slot they need.
//
// Time is wall-clock time while the guest runs (between the host's own reads of the clock),
// which is CPU time unless the OS deschedules the thread; a call shorter than a fuel refill is
// charged when it returns. Time waiting for a running slot is paused time, like a share's pause.

const (
	cpuSharePeriod = 500 * time.Microsecond
	cpuShareBurst  = 2 * time.Millisecond   // credit a share may build up while idle
	minPause       = 200 * time.Microsecond // shorter debts are carried to the next charge
)

// CPUShare bounds the guest execution time of the engines that use it (WithCPUShare). It is a
// virtual clock (GCRA): each charge of t of guest time advances it by t/cores, and a charger
// pauses until the real clock catches up with it (less a small credit). Because the clock is
// shared, two guests overdrawing one share resume one after the other rather than together:
// a share of one core keeps its guests on about one processor at a time.
type CPUShare struct {
	mu     sync.Mutex
	cores  float64
	tat    time.Duration // the virtual clock, in monotonic time
	wake   chan struct{} // closed (and replaced) by SetCores: paused guests re-charge at the new rate
	paused atomic.Int64  // nanoseconds its guests have paused, in all
	used   atomic.Int64  // nanoseconds of guest time charged, in all

	// Running slots. INVARIANT (under mu): running ≤ slots(cores) except transiently after
	// SetCores lowers the share (calls running then keep their slots until they give them up),
	// and running counts exactly the instances whose holdsSlot is set.
	running int
	waiting int           // enter calls waiting for a slot
	freed   chan struct{} // closed (and replaced) when a slot frees while someone waits
	peak    atomic.Int64  // the most guests that ran at once
}

// Used returns the guest time charged to the share in all.
func (c *CPUShare) Used() time.Duration { return time.Duration(c.used.Load()) }

// Paused returns how long the share's guests have been paused in all (throttled time).
func (c *CPUShare) Paused() time.Duration { return time.Duration(c.paused.Load()) }

// NewCPUShare returns a share of cores cores (<= 0: unlimited).
func NewCPUShare(cores float64) *CPUShare { return &CPUShare{cores: cores, wake: make(chan struct{})} }

// SetCores changes the share while its engines run (a live quota change). It applies at once:
// the guest time the share owes is carried over at the new rate (a debt of d at c cores is d×c
// of guest time, owed for d×c/cores at the new cores; none if the share becomes unlimited),
// and guests paused at the old rate wake and re-charge at the new one.
func (c *CPUShare) SetCores(cores float64) { c.setCores(cores, monotonic()) }

func (c *CPUShare) setCores(cores float64, now time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if debt := c.tat - now; debt > 0 && c.cores > 0 && cores > 0 {
		c.tat = now + time.Duration(float64(debt)*c.cores/cores)
	} else if debt > 0 {
		c.tat = now
	}
	c.cores = cores
	close(c.wake)
	c.wake = make(chan struct{})
	if c.waiting > 0 { // more slots, or none needed any more
		close(c.freed)
		c.freed = make(chan struct{})
	}
}

// slots is how many of a share's guests may run at once: ⌈cores⌉, at least 1; 0 for no limit.
func slots(cores float64) int {
	if cores <= 0 {
		return 0
	}
	return max(1, int(math.Ceil(cores-1e-9)))
}

// PeakRunning returns the most of the share's guests that ran at the same instant.
func (c *CPUShare) PeakRunning() int { return int(c.peak.Load()) }

// enter takes a running slot, waiting (off the processor) while all are taken. It returns
// whether the caller holds one (false: the share has no limit, or done was closed first).
func (c *CPUShare) enter(done <-chan struct{}) bool {
	c.mu.Lock()
	for {
		n := slots(c.cores)
		if n == 0 {
			c.mu.Unlock()
			return false
		}
		if c.running < n {
			c.running++
			if p := int64(c.running); p > c.peak.Load() {
				c.peak.Store(p)
			}
			c.mu.Unlock()
			return true
		}
		if c.freed == nil {
			c.freed = make(chan struct{})
		}
		freed := c.freed
		c.waiting++
		c.mu.Unlock()
		select {
		case <-freed:
		case <-done:
			c.mu.Lock()
			c.waiting--
			c.mu.Unlock()
			return false
		}
		c.mu.Lock()
		c.waiting--
	}
}

// leave gives a running slot back.
func (c *CPUShare) leave() {
	c.mu.Lock()
	c.running--
	if c.waiting > 0 {
		close(c.freed)
		c.freed = make(chan struct{})
	}
	c.mu.Unlock()
}

// Cores returns the share's cores (<= 0: unlimited).
func (c *CPUShare) Cores() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cores
}

// charge accounts used guest time at now and returns how long the caller should pause, and a
// channel closed if the share changes before that.
func (c *CPUShare) charge(used, now time.Duration) (time.Duration, <-chan struct{}) {
	c.used.Add(int64(used))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cores <= 0 {
		return 0, nil
	}
	if floor := now - cpuShareBurst; c.tat < floor {
		c.tat = floor // idle time earns at most cpuShareBurst of credit
	}
	c.tat += time.Duration(float64(used) / c.cores)
	return max(c.tat-now, 0), c.wake
}

// WithCPUShare makes the engine's guests run within share (see "CPU shares").
func WithCPUShare(share *CPUShare) EngineOption {
	return engineOptionFunc(func(c *engineConfig) { c.share = share })
}

// chargeCPU charges the time since the instance's last charge to its engine's share, and
// pauses the call (off the processor) while the share is overdrawn. It returns the time paused.
func (in *Instance) chargeCPU() time.Duration {
	sh := in.m.e.share
	if sh == nil {
		return 0
	}
	now := monotonic()
	used := now - in.lastCharge
	in.lastCharge = now
	pause, changed := sh.charge(used, now)
	if pause < minPause {
		return 0
	}
	t := time.NewTimer(pause)
	select {
	case <-t.C:
	case <-changed: // a new rate: what is still owed is charged again at the next check
		t.Stop()
	case <-in.ctx.Done():
		t.Stop()
	}
	in.lastCharge = monotonic()
	sh.paused.Add(int64(in.lastCharge - now))
	return in.lastCharge - now
}

// enterShare takes a running slot of the engine's share for the call that starts, if the share
// limits them (see "CPU shares"). The wait is paused time: the call's time limit and the
// share's charge start after it.
func (in *Instance) enterShare() {
	sh := in.m.e.share
	if sh == nil || in.holdsSlot {
		return
	}
	before := monotonic()
	in.holdsSlot = sh.enter(in.ctx.Done())
	if now := monotonic(); now-before > time.Microsecond {
		sh.paused.Add(int64(now - before))
		in.budgetStart += now - before
	}
	in.lastCharge = monotonic()
}

// leaveShare charges the call's running time so far and gives its running slot back. Without a
// share (the common case) it is a check the compiler inlines into every call's end.
func (in *Instance) leaveShare() {
	if in.m.e.share != nil {
		in.leaveHeldShare()
	}
}

func (in *Instance) leaveHeldShare() {
	in.chargeCPU()
	if in.holdsSlot {
		in.holdsSlot = false
		in.m.e.share.leave()
	}
}

// NoteSuspended tells the instance that its current call is about to wait in an async import:
// its running time so far is charged, and it gives its CPU share's running slot up until
// NoteResumed.
func (in *Instance) NoteSuspended() {
	in.leaveShare()
}

// Blocking runs f, a host operation inside the current call that may wait on other
// goroutines (an emit handing a full batch to a backpressured sink), with the call's CPU-share
// running slot given up meanwhile, so that what f waits for (the tenant's other operators)
// can run. The time f takes is neither the guest's running time nor its call time.
func (in *Instance) Blocking(f func() error) error {
	if in.m.e.share == nil {
		return f()
	}
	held := in.holdsSlot
	in.leaveShare()
	before := monotonic()
	err := f()
	in.budgetStart += monotonic() - before
	if held {
		in.enterShare()
	}
	in.lastCharge = monotonic()
	return err
}

// yieldAtCheck runs at every fuel check: the processor is offered to other goroutines, and the
// share is charged (neither the pause nor the time others ran after the yield is the call's
// running time).
func (in *Instance) yieldAtCheck() {
	if paused := in.chargeCPU(); paused > 0 {
		in.budgetStart += paused
		return
	}
	if in.m.e.share == nil {
		runtime.Gosched()
		return
	}
	before := monotonic()
	runtime.Gosched()
	// Whatever ran on this processor meanwhile (another tenant's goroutines) is not this
	// guest's time: neither its share's nor its call time limit's.
	in.lastCharge = monotonic()
	in.budgetStart += in.lastCharge - before
}
