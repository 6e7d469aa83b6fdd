package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/control"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// # Live quotas
//
// A PATCH of a tenant's quotas reaches its running pipelines at once (tenantQuotasChanged):
//   - max_in_flight_records, cpu_time_per_record_ms and guest_memory_bytes become each
//     operator's limits again (applyQuotas over the run's own spec) and go to the job with
//     Job.SetLimits: the in-flight cap applies at each runner's next step, the call time at each
//     running call's next fuel check, and guest memory refuses growth past the new limit (it
//     takes no memory back from an instance that has it, and cannot rise past what the
//     operator started with: that takes a restart);
//   - hot_tier_bytes re-shares the run's hot tier at once (state.Store.SetHotBytes);
//   - lookup_requests_per_second changes the tenant's lookup gate (below);
//   - guest_cpu_millicores changes the tenant's CPU share (abi.CPUShare), one per tenant shared
//     by all its operators: their guests run at most that many thousandths of a core on average
//     (times the host's capacity under CPU pressure: capacity.go), a call overdrawing it
//     pausing at its next fuel check or return.
//
// max_pipelines, max_subtasks and max_modules are admission quotas. allowed_lookup_hosts is
// checked when a spec is accepted.
//
// ## Quotas lowered below usage
//
// A PATCH may lower an admission quota below what the tenant uses. As with Kubernetes'
// ResourceQuota, the new limit applies to what is admitted from then on and nothing is stopped
// or deleted for it (an admin's PATCH does not take down a tenant's production pipelines):
//   - the tenant view (and the PATCH's answer) lists the quotas it is over in over_quota, each
//     with its usage and limit, and the server logs a warning;
//   - what would add usage is refused with 422 naming the quota: creating a pipeline over
//     max_pipelines; starting a stopped pipeline whose subtasks do not fit beside the running
//     ones; a spec change or rescale that adds subtasks; uploading a module over max_modules;
//   - what does not add usage is accepted: the running pipelines keep running and resume
//     after a restart of the server (they were admitted), and a spec change or rescale that
//     keeps or lowers a pipeline's subtasks restarts it as usual. Stopping, rescaling down
//     or deleting pipelines brings the tenant back under the quota.
//
// ## The lookup rate
//
// Every lookup of a tenant's pipelines passes the tenant's gate, one per tenant shared by all
// of its pipelines and operators. The rule, a GCRA token bucket:
//   - lookups are admitted at lookup_requests_per_second on average, with bursts of up to a
//     tenth of a second's worth (at least one);
//   - a lookup beyond that waits for its turn, in arrival order, without holding the operator
//     (its record is suspended, as for any lookup), for at most maxLookupWait;
//   - a lookup that would wait longer fails at once with LOOKUP_UNAVAILABLE (-20), and with a
//     quota of 0 every lookup fails with LOOKUP_REFUSED (-19). The guest decides what a failed
//     lookup means; the error names the quota.
// A tenant's waiting lookups are therefore bounded by its rate times maxLookupWait.
//
// ## The state-bytes quota
//
// state_bytes bounds a tenant's durable state: every object under state/<tenant>/ in the data
// store (live segments, retained checkpoints and the garbage not yet collected), measured by
// listing it (control.UsageStore) after a committed checkpoint, at most once per
// stateCheckEvery per tenant, and at each start. A pipeline whose checkpoint finds its tenant
// over the quota fails with an error naming quotas.state_bytes; its committed state stays, and
// a start is refused while the tenant is over (raise the quota, or delete pipelines).

const (
	maxLookupWait   = time.Second
	stateCheckEvery = 2 * time.Second
)

// lookupGate is a tenant's lookup rate (pipeline.LookupGate).
type lookupGate struct {
	tenant string
	m      *metrics

	mu   sync.Mutex
	rate int
	tat  time.Time // the GCRA's theoretical arrival time
}

func (g *lookupGate) setRate(n int) {
	g.mu.Lock()
	g.rate = n
	g.mu.Unlock()
}

// reserve takes the next turn at now: how long the lookup waits, or why it is refused.
func (g *lookupGate) reserve(now time.Time) (time.Duration, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rate <= 0 {
		return 0, fmt.Errorf("%w: tenant %q's lookup_requests_per_second quota is 0", abi.LookupRefused, g.tenant)
	}
	interval := time.Second / time.Duration(g.rate)
	tolerance := time.Duration(max(1, g.rate/10)-1) * interval
	if g.tat.Before(now) {
		g.tat = now
	}
	wait := max(g.tat.Sub(now)-tolerance, 0)
	if wait > maxLookupWait {
		return 0, fmt.Errorf("%w: tenant %q is over its lookup_requests_per_second quota of %d (this lookup would wait %v, more than %v)",
			abi.LookupUnavailable, g.tenant, g.rate, wait.Round(time.Millisecond), maxLookupWait)
	}
	g.tat = g.tat.Add(interval)
	return wait, nil
}

// Admit implements pipeline.LookupGate.
func (g *lookupGate) Admit(ctx context.Context, admitted func(error)) {
	wait, err := g.reserve(time.Now())
	if err != nil {
		g.count("refused")
		admitted(err)
		return
	}
	if wait == 0 {
		admitted(nil)
		return
	}
	g.count("delayed")
	var (
		mu    sync.Mutex
		once  sync.Once
		fired bool
		stop  func() bool
	)
	fire := func(err error) { once.Do(func() { admitted(err) }) }
	t := time.AfterFunc(wait, func() {
		mu.Lock()
		fired = true
		s := stop
		mu.Unlock()
		if s != nil {
			s()
		}
		fire(nil)
	})
	s := context.AfterFunc(ctx, func() {
		if t.Stop() {
			fire(fmt.Errorf("%w: %w", abi.LookupCancelled, context.Cause(ctx)))
		}
	})
	mu.Lock()
	stop = s
	done := fired
	mu.Unlock()
	if done {
		s()
	}
}

func (g *lookupGate) count(outcome string) {
	if g.m != nil {
		g.m.lookupThrottled.WithLabelValues(g.tenant, outcome).Inc()
	}
}

// gate returns tenant's lookup gate, created at rate.
func (rt *runtime) gate(tenant string, rate int) *lookupGate {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	g := rt.gates[tenant]
	if g == nil {
		g = &lookupGate{tenant: tenant, m: rt.s.metrics, rate: rate}
		rt.gates[tenant] = g
	}
	return g
}

// liveLimits are the operator limits of a run's spec under q.
func liveLimits(r *run, q control.Quotas) (map[string]pipeline.LimitsSpec, error) {
	spec, err := runtimeSpec(r.name, r.tenant, r.rawSpec)
	if err != nil {
		return nil, err
	}
	spec.ApplyDefaults()
	applyQuotas(spec, q)
	out := make(map[string]pipeline.LimitsSpec, len(spec.Operators))
	for _, op := range spec.Operators {
		out[op.Name] = op.Limits
	}
	return out, nil
}

// share returns tenant's CPU share, set to millicores (times the host's capacity: capacity.go).
func (rt *runtime) share(tenant string, millicores int64) *abi.CPUShare {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.shareQuota[tenant] = millicores
	cores := float64(millicores) / 1000 * rt.capacity
	sh := rt.shares[tenant]
	if sh == nil {
		sh = abi.NewCPUShare(cores)
		rt.shares[tenant] = sh
	} else {
		sh.SetCores(cores)
	}
	return sh
}

// tenantQuotasChanged gives tenant t's running pipelines its new quotas.
func (rt *runtime) tenantQuotasChanged(t *control.Tenant) {
	q := t.Quotas
	rt.share(t.Name, q.GuestCPUMillicores)
	rt.gate(t.Name, q.LookupRequestsPerSec).setRate(q.LookupRequestsPerSec)
	rt.mu.Lock()
	var runs []*run
	for _, r := range rt.runs {
		if r != nil && r.tenant == t.Name && r.job != nil && r.running() {
			runs = append(runs, r)
		}
	}
	rt.mu.Unlock()
	for _, r := range runs {
		lim, err := liveLimits(r, q)
		if err == nil {
			err = r.job.SetLimits(lim)
		}
		if err != nil {
			rt.s.log.Warn("applying changed quotas to a running pipeline failed", "tenant", t.Name, "pipeline", r.id, "err", err)
			continue
		}
		if q.HotTierBytes > 0 {
			r.store.SetHotBytes(q.HotTierBytes)
		}
		rt.s.log.Info("quotas applied to a running pipeline", "tenant", t.Name, "pipeline", r.id)
	}
}

// tenantUsage is a tenant's last measured durable state.
type tenantUsage struct {
	measuring sync.Mutex // held while listing: one measurement of a tenant at a time
	mu        sync.Mutex // the values below; never held while listing
	bytes     int64
	objects   int64
	at        time.Time // zero: never measured
}

// ErrStateQuota is the error of a tenant over its state_bytes quota.
var ErrStateQuota = errors.New("over the state_bytes quota")

// StateQuotaError says how far over its state_bytes quota a tenant is.
type StateQuotaError struct {
	Tenant       string
	Bytes, Quota int64
}

func (e *StateQuotaError) Error() string {
	return fmt.Sprintf("quotas.state_bytes: tenant %q holds %d bytes of durable state, over its state_bytes quota of %d (raise the quota or delete pipelines)", e.Tenant, e.Bytes, e.Quota)
}

func (e *StateQuotaError) Unwrap() error { return ErrStateQuota }

// stateUsage measures tenant's durable state (at most once per stateCheckEvery unless force);
// ok is false when the data store cannot be measured.
func (rt *runtime) stateUsage(ctx context.Context, tenant string, force bool) (bytes int64, ok bool, err error) {
	us, isUS := rt.s.ctl.Store().(control.UsageStore)
	if !isUS {
		return 0, false, nil
	}
	rt.mu.Lock()
	u := rt.usage[tenant]
	if u == nil {
		u = &tenantUsage{}
		rt.usage[tenant] = u
	}
	rt.mu.Unlock()
	u.measuring.Lock()
	defer u.measuring.Unlock()
	u.mu.Lock()
	fresh := !u.at.IsZero() && time.Since(u.at) < stateCheckEvery
	last := u.bytes
	u.mu.Unlock()
	if fresh && !force {
		return last, true, nil
	}
	prefix, err := control.TenantStatePrefix(tenant)
	if err != nil {
		return 0, false, err
	}
	n, objs, err := us.Usage(ctx, prefix)
	if err != nil {
		return 0, false, err
	}
	u.mu.Lock()
	u.bytes, u.objects, u.at = n, objs, time.Now()
	u.mu.Unlock()
	return n, true, nil
}

// measuredState is tenant's last measured durable state, if it was measured.
func (rt *runtime) measuredState(tenant string) (int64, bool) {
	rt.mu.Lock()
	u := rt.usage[tenant]
	rt.mu.Unlock()
	if u == nil {
		return 0, false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.bytes, !u.at.IsZero()
}

// checkStateQuota returns a *StateQuotaError when tenant is over its state_bytes quota.
func (rt *runtime) checkStateQuota(ctx context.Context, tenant string, force bool) error {
	t, ok := rt.s.ctl.Snapshot().Tenants[tenant]
	if !ok {
		return nil
	}
	n, ok, err := rt.stateUsage(ctx, tenant, force)
	if err != nil {
		rt.s.log.Warn("measuring a tenant's durable state failed", "tenant", tenant, "err", err)
		return nil // an unmeasurable store does not stop pipelines; the next check retries
	}
	if ok && n > t.Quotas.StateBytes {
		return &StateQuotaError{Tenant: tenant, Bytes: n, Quota: t.Quotas.StateBytes}
	}
	return nil
}

// failForQuota stops r because of a quota; its watcher records err as the failure.
func (rt *runtime) failForQuota(r *run, err error) {
	r.mu.Lock()
	if r.quotaErr != nil {
		r.mu.Unlock()
		return
	}
	r.quotaErr = err
	r.mu.Unlock()
	rt.s.log.Warn("pipeline over a quota: stopping it", "tenant", r.tenant, "pipeline", r.id, "err", err)
	ctx, cancel := context.WithTimeout(context.Background(), shutdownStopTimeout)
	defer cancel()
	if _, serr := r.job.Stop(ctx, false); serr != nil && !errors.Is(serr, pipeline.ErrNotRunning) {
		rt.s.log.Warn("stopping a pipeline over its quota failed", "pipeline", r.id, "err", serr)
	}
}
