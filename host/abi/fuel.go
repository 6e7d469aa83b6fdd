package abi

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// Runaway guests
//
// Every module is rewritten at load time (internal/wasmbin) so that function entries and loop
// headers decrement a fuel global and, when it goes below zero, call
// clink_internal.fuel_exhausted. That host function is the only place a running call can be
// stopped. It checks the call's context and time budget, and returns fuelRefill more units or
// aborts the call.
//
// One unit is one loop iteration or one function entry, whatever the loop's body does, so how
// long a refill lasts depends on the guest's code. Measured with BenchmarkFuelRefill (wazero
// 1.12, shared 2-core VM, without the watchdog): an empty loop uses a refill in 0.6 ms (10 ms
// under heavy load), exponential recursion in ~3 ms, a loop of 100 multiply-adds in ~0.8 s, and a
// loop that fills 1 MiB of memory per iteration in ~23 s. Counting alone would therefore let such a call overrun its time limit by seconds or
// minutes. So the refill only bounds how often a tight loop reaches the host, and time is
// enforced by a watchdog:
//
//   - Each engine has one watchdog goroutine, ticking while the engine has instances. Every
//     period (CallTime/16, between 1 and 50 ms) it sets the fuel of every live instance to 0,
//     through the global the rewrite exports (wasmbin.FuelExportName), so that the next check
//     of a running call reaches the host. It costs no call anything: an instance that is not
//     running makes one extra host check on its next call, at most once per period.
//   - The guest's decrement is a load and a store, and the fuel import's refill is stored on its
//     return, so a 0 written at that moment is overwritten; the next period writes it again.
//   - When an instance's context is cancelled, its fuel is set to 0 at once.
//
// The time budget is measured without reading the clock on every call: the first check after a
// call starts (or resumes from a suspension) records the time, and any later check in the same
// run compares against it. A runaway call therefore stops within its time limit plus about two
// watchdog periods and one loop iteration (BenchmarkFuelRefill's ms-late: medians 0.4-1.1 ms at
// a 200 ms limit, at most 40 ms in 20 runs). Time spent suspended in an async import never
// counts, nor, with a CPU share, time paused by it or taken by other goroutines after a check's
// yield. What a check cannot split is one instruction:
// a single memory.fill or memory.copy of the whole memory, at most the memory limit's worth.

// fuelRefill is the fuel granted per check: 0.6-10 ms of the tightest loop, so a busy call
// reaches the host at most ~1600 times a second on its own (each check costs ~100 ns).
const fuelRefill = 1 << 20

var clockBase = time.Now()

func monotonic() time.Duration { return time.Since(clockBase) }

func fuelExhausted(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	in.refills++
	if err := in.checkBudget(); err != nil {
		panic(err)
	}
	stack[0] = fuelRefill
	in.yieldAtCheck()
}

func (in *Instance) checkBudget() error {
	if err := in.ctx.Err(); err != nil {
		return &budgetError{cancelled: true, cause: context.Cause(in.ctx)}
	}
	now := monotonic()
	if in.budgetSeq != in.seq {
		in.budgetSeq = in.seq
		in.budgetStart = now
		return nil
	}
	if limit := in.m.e.callTime(); now-in.budgetStart > limit {
		if sh := in.m.e.share; sh != nil {
			// The share is charged the call's last stretch too: what it counts as the
			// guest's own time is what the budget counted.
			sh.charge(now-in.lastCharge, now)
			in.lastCharge = now
		}
		return &budgetError{cause: fmt.Errorf("ran for more than %v without returning (runaway loop?)", limit)}
	}
	return nil
}

// watchdogPeriod is how often the watchdog forces a fuel check, for a call time limit of d.
func watchdogPeriod(d time.Duration) time.Duration {
	return min(max(d/16, time.Millisecond), 50*time.Millisecond)
}

// watchdog forces fuel checks of an engine's live instances; see "Runaway guests" above.
//
// Its goroutine belongs to the engine: started by NewEngine and ended by Close, never by an
// instance, so it lives wherever the engine's owner lives (a testing/synctest bubble that only
// instantiates does not own it). While the engine has no instances it sleeps on a condition
// variable, with no timer.
type watchdog struct {
	period time.Duration
	stop   chan struct{} // closed by close
	wake   *sync.Cond    // on mu: signalled when live stops being empty, or on close

	mu struct {
		sync.Mutex
		// INVARIANT: an instance is in live from just after it is instantiated until just
		// before its module is closed, so the watchdog never writes to a closed module's fuel.
		live   map[*Instance]api.MutableGlobal
		closed bool
	}
}

func newWatchdog(period time.Duration) *watchdog {
	w := &watchdog{period: period, stop: make(chan struct{})}
	w.mu.live = make(map[*Instance]api.MutableGlobal)
	w.wake = sync.NewCond(&w.mu.Mutex)
	go w.run()
	return w
}

// add starts watching in, whose fuel global is fuel.
func (w *watchdog) add(in *Instance, fuel api.MutableGlobal) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mu.closed {
		return
	}
	w.mu.live[in] = fuel
	if len(w.mu.live) == 1 {
		w.wake.Signal()
	}
}

// remove stops watching in. It must be called before in's module is closed.
func (w *watchdog) remove(in *Instance) {
	w.mu.Lock()
	delete(w.mu.live, in)
	w.mu.Unlock()
}

// poke makes in's next fuel check reach the host, if in is still live.
func (w *watchdog) poke(in *Instance) {
	w.mu.Lock()
	if fuel, ok := w.mu.live[in]; ok {
		fuel.Set(0)
	}
	w.mu.Unlock()
}

// close forgets every instance (the runtime is closing them) and ends the goroutine.
func (w *watchdog) close() {
	w.mu.Lock()
	if !w.mu.closed {
		w.mu.closed = true
		clear(w.mu.live)
		close(w.stop)
		w.wake.Signal()
	}
	w.mu.Unlock()
}

func (w *watchdog) run() {
	for {
		w.mu.Lock()
		for len(w.mu.live) == 0 && !w.mu.closed {
			w.wake.Wait()
		}
		closed := w.mu.closed
		w.mu.Unlock()
		if closed {
			return
		}
		w.tick()
	}
}

// tick empties the fuel of every live instance once per period until there are none left.
func (w *watchdog) tick() {
	t := time.NewTicker(w.period)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		w.mu.Lock()
		for _, fuel := range w.mu.live {
			fuel.Set(0)
		}
		idle := len(w.mu.live) == 0
		w.mu.Unlock()
		if idle {
			return
		}
	}
}

// nanosleep serves WASI poll_oneoff clock waits. A sleep that would run past the call's time
// budget fails the call instead of blocking the runner.
func (in *Instance) nanosleep(ns int64) {
	if err := in.ctx.Err(); err != nil {
		panic(&budgetError{cancelled: true, cause: context.Cause(in.ctx)})
	}
	d := time.Duration(ns)
	if limit := in.m.e.callTime(); d > limit {
		panic(&budgetError{cause: fmt.Errorf("asked to sleep %v, longer than the time limit of %v", d, limit)})
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-in.ctx.Done():
		panic(&budgetError{cancelled: true, cause: context.Cause(in.ctx)})
	}
}
