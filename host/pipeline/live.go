package pipeline

import (
	"bytes"
	"context"
	"fmt"

	"github.com/clink-wasm/clink-wasm/host/scheduler"
)

// # Live limits
//
// A hosted pipeline's limits follow its tenant's quotas while it runs (host/server): SetLimits
// changes an operator's in-flight cap, guest call time and guest memory without a restart, and
// Env.LookupGate admits each lookup (the tenant's lookup rate). Parallelism is not live: it
// changes by a rescale, which restarts from a savepoint.

// LookupGate admits lookups before they are sent. Admit calls admitted exactly once, from any
// goroutine: with nil to send the lookup now, or with an error that fails it. The error should
// wrap an abi.Code (LookupUnavailable, LookupRefused): that is the result code the guest sees.
// Admit must not block the caller (the operator's runner): a delayed lookup is admitted later,
// from a timer.
type LookupGate interface {
	Admit(ctx context.Context, admitted func(error))
}

// gateLookups puts g in front of fn.
func gateLookups(g LookupGate, fn scheduler.LookupFunc) scheduler.LookupFunc {
	return func(ctx context.Context, endpoint uint32, req []byte, done func(int, []byte, error)) {
		req = bytes.Clone(req) // the guest's bytes are ours only until we return; Admit may wait
		g.Admit(ctx, func(err error) {
			if err != nil {
				done(0, nil, err)
				return
			}
			fn(ctx, endpoint, req, done)
		})
	}
}

// SetLimits changes operator limits while the job runs, by operator name; unknown names are an
// error (nothing changes then). For each operator:
//   - MaxInFlight (> 0) is each subtask's in-flight cap from the runner's next iteration: a
//     lower cap admits nothing more until in-flight records fall below it (none is dropped);
//   - CallTimeout (> 0) is the guest time limit from each running call's next fuel check;
//   - MemoryPages (> 0) refuses guest memory growth past it from now on, up to the memory
//     limit the operator started with (its reservation; raising past that needs a restart),
//     without taking memory from an instance that has it already.
//
// Zero fields are left as they are. The limits also hold for later attempts (restarts after a
// failure); MaxRecordBytes is not live.
func (j *Job) SetLimits(ops map[string]LimitsSpec) error {
	for name := range ops {
		if j.opNode(name) == nil {
			return fmt.Errorf("pipeline %s has no operator %q", j.spec.Name, name)
		}
	}
	for name, l := range ops {
		n := j.opNode(name)
		cur := LimitsSpec{}
		if p := n.live.Load(); p != nil {
			cur = *p
		}
		if l.MaxInFlight > 0 {
			cur.MaxInFlight = l.MaxInFlight
		}
		if l.CallTimeout > 0 {
			cur.CallTimeout = l.CallTimeout
		}
		if l.MemoryPages > 0 {
			cur.MemoryPages = l.MemoryPages
		}
		n.live.Store(&cur)
		n.eng.SetLiveLimits(l.CallTimeout.D(), l.MemoryPages)
	}
	j.mu.Lock()
	a := j.cur
	j.mu.Unlock()
	if a == nil {
		return nil
	}
	for _, t := range a.opTasks {
		t.applyLiveInFlight()
	}
	return nil
}

func (j *Job) opNode(name string) *opNode {
	for _, n := range j.ops {
		if n.spec.Name == name {
			return n
		}
	}
	return nil
}

// maxInFlight is the in-flight cap an operator subtask starts with: the live one if set.
func (n *opNode) maxInFlight() int {
	if p := n.live.Load(); p != nil && p.MaxInFlight > 0 {
		return p.MaxInFlight
	}
	return n.spec.Limits.MaxInFlight
}

// applyLiveInFlight gives t's controller (if it runs) the operator's live in-flight cap.
func (t *operatorTask) applyLiveInFlight() {
	if p := t.op.live.Load(); p != nil && p.MaxInFlight > 0 {
		if c := t.ctrl.Load(); c != nil {
			c.SetMaxInFlight(p.MaxInFlight)
		}
	}
}

// Limits returns each operator's limits in force: the spec's, with the live changes over them.
func (j *Job) Limits() map[string]LimitsSpec {
	out := make(map[string]LimitsSpec, len(j.ops))
	for _, n := range j.ops {
		l := n.spec.Limits
		if p := n.live.Load(); p != nil {
			if p.MaxInFlight > 0 {
				l.MaxInFlight = p.MaxInFlight
			}
			if p.CallTimeout > 0 {
				l.CallTimeout = p.CallTimeout
			}
			if p.MemoryPages > 0 {
				l.MemoryPages = min(p.MemoryPages, n.eng.Limits().MemoryPages)
			}
		}
		out[n.spec.Name] = l
	}
	return out
}
