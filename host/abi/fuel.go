package abi

import (
	"context"
	"fmt"
	"time"
)

// Runaway guests
//
// Every module is rewritten at load time (internal/wasmbin) so that function entries and loop
// headers decrement a fuel global and, when it reaches zero, call clink_internal.fuel_exhausted.
// That host function is the only place a running call can be stopped, and it is reached only
// once per fuelRefill units of work, so the check costs nothing measurable per call and about a
// global decrement per loop iteration.
//
// The time budget is measured without reading the clock on every call: the first fuel check
// after a call starts (or resumes from a suspension) records the time; any later check in the
// same run compares against it. A call therefore stops within about one refill's worth of work
// after its budget (typically well under a millisecond), and time spent suspended in an async
// import never counts.

// fuelRefill is the fuel granted per check. At roughly 1-5 ns per unit this is one check every
// 0.5-5 ms of guest execution.
const fuelRefill = 1 << 20

var clockBase = time.Now()

func monotonic() time.Duration { return time.Since(clockBase) }

func fuelExhausted(ctx context.Context, stack []uint64) {
	in := instance(ctx)
	if err := in.checkBudget(); err != nil {
		panic(err)
	}
	stack[0] = fuelRefill
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
	if now-in.budgetStart > in.limits.CallTime {
		return &budgetError{cause: fmt.Errorf("ran for more than %v without returning (runaway loop?)", in.limits.CallTime)}
	}
	return nil
}

// nanosleep serves WASI poll_oneoff clock waits. A sleep that would run past the call's time
// budget fails the call instead of blocking the runner.
func (in *Instance) nanosleep(ns int64) {
	if err := in.ctx.Err(); err != nil {
		panic(&budgetError{cancelled: true, cause: context.Cause(in.ctx)})
	}
	d := time.Duration(ns)
	if d > in.limits.CallTime {
		panic(&budgetError{cause: fmt.Errorf("asked to sleep %v, longer than the time limit of %v", d, in.limits.CallTime)})
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-in.ctx.Done():
		panic(&budgetError{cancelled: true, cause: context.Cause(in.ctx)})
	}
}
