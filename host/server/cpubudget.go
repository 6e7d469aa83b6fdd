package server

import (
	"fmt"
	"net/http"
	goruntime "runtime"
	"slices"
	"strings"

	"github.com/clink-wasm/clink-wasm/host/control"
)

// # The guest CPU budget
//
// A tenant's guest_cpu_millicores bounds its guests (abi.CPUShare), but it guarantees nothing
// if the tenants that run at once were promised more cores than the host has: each at its
// quota, they take the CPU the others' request paths need, and the capacity scaling
// (capacity.go) can only shrink everyone's share after the fact. So the server admits a
// tenant's CPU share only if it fits in the host's guest CPU budget, the way a cluster
// scheduler places a pod only on a node where its CPU request fits:
//
//   - the budget is Config.GuestCPUBudget millicores (serve --guest-cpu-budget), by default the
//     host's cores (GOMAXPROCS × 1000, which follows a container's CPU limit); negative turns
//     the check off (overcommit allowed);
//   - the committed CPU is the sum of the quotas of the tenants that run pipelines (running,
//     or being started); a quota of 0 (no bound) counts as the whole budget;
//   - starting a stopped pipeline of a tenant that runs none yet, and a PATCH that raises the
//     guest_cpu_millicores of a tenant that runs pipelines, are refused with 409
//     cpu_overcommitted (field quotas.guest_cpu_millicores) when the committed CPU would
//     exceed the budget. The answer says how much is left;
//   - tenants that run nothing commit nothing, so any number of them may be created with the
//     default quota; a tenant's second pipeline adds nothing (one share covers all of a
//     tenant's pipelines); lowering a quota is never refused;
//   - what was admitted is not refused later: pipelines resumed after a restart of the server
//     (or restarted by an upgrade or a rescale) start whatever the budget, and the server logs
//     a warning when the committed CPU is then over it (a budget lowered across the restart).
//
// admitMu serializes the check with what it depends on (a start's marking, a PATCH's commit),
// so two admissions cannot both take the last free cores.

// defaultCPUBudget is the budget for Config.GuestCPUBudget: 0 is the host's cores, < 0 none.
func defaultCPUBudget(configured int64) int64 {
	switch {
	case configured < 0:
		return 0
	case configured == 0:
		return int64(goruntime.GOMAXPROCS(0)) * 1000
	}
	return configured
}

// activeTenantsLocked is the set of tenants with a running pipeline or one being started.
// rt.mu is held.
func (rt *runtime) activeTenantsLocked() map[string]bool {
	active := map[string]bool{}
	for _, r := range rt.runs {
		if r != nil && r.job != nil && r.running() {
			active[r.tenant] = true
		}
	}
	for _, tenant := range rt.starting {
		active[tenant] = true
	}
	return active
}

// committed is what tenant's quota commits of the budget: its millicores, all of it for 0.
func committed(millicores, budget int64) int64 {
	if millicores <= 0 {
		return budget
	}
	return millicores
}

// cpuFits checks that tenant, at millicores, fits in the budget beside the other active tenants
// (their quotas as cat has them).
func cpuFits(cat *control.Catalog, active map[string]bool, tenant string, millicores, budget int64) error {
	if budget <= 0 {
		return nil
	}
	var others int64
	var names []string
	for name := range active {
		t, ok := cat.Tenants[name]
		if name == tenant || !ok {
			continue
		}
		others += committed(t.Quotas.GuestCPUMillicores, budget)
		names = append(names, fmt.Sprintf("%s %d", name, t.Quotas.GuestCPUMillicores))
	}
	need := committed(millicores, budget)
	if others+need <= budget {
		return nil
	}
	slices.Sort(names)
	quota := fmt.Sprintf("%d", millicores)
	if millicores <= 0 {
		quota = "0 (no bound, which commits the whole budget)"
	}
	return problem(http.StatusConflict, CodeCPUOvercommitted, "quotas.guest_cpu_millicores",
		"tenant %q's guest_cpu_millicores of %s does not fit in the host's guest CPU budget of %d millicores: the tenants running pipelines (%s) have %d of it, %d are left. Lower the quota, stop another tenant's pipelines, or give the server a larger --guest-cpu-budget",
		tenant, quota, budget, strings.Join(names, ", "), others, max(0, budget-others))
}

// admitCPULocked checks that tenant's share fits before a stopped pipeline of it starts. A tenant
// that runs pipelines already has its share counted. rt.mu and rt.admitMu are held.
func (rt *runtime) admitCPULocked(cat *control.Catalog, tenant string) error {
	if rt.cpuBudget <= 0 {
		return nil
	}
	active := rt.activeTenantsLocked()
	t, ok := cat.Tenants[tenant]
	if active[tenant] || !ok {
		return nil // counted already; or no such tenant, which the start reports
	}
	return cpuFits(cat, active, tenant, t.Quotas.GuestCPUMillicores, rt.cpuBudget)
}

// checkCPUChange checks a change of tenant's guest_cpu_millicores from old to now, within a
// catalog update (cat is the catalog being changed). Only a raise of a tenant that runs
// pipelines can be refused. rt.admitMu is held.
func (rt *runtime) checkCPUChange(cat *control.Catalog, tenant string, old, now int64) error {
	if rt.cpuBudget <= 0 || committed(now, rt.cpuBudget) <= committed(old, rt.cpuBudget) {
		return nil
	}
	rt.mu.Lock()
	active := rt.activeTenantsLocked()
	rt.mu.Unlock()
	if !active[tenant] {
		return nil
	}
	return cpuFits(cat, active, tenant, now, rt.cpuBudget)
}

// warnOvercommitted logs when the running tenants' shares exceed the budget (after a resume).
func (rt *runtime) warnOvercommitted() {
	if rt.cpuBudget <= 0 {
		return
	}
	cat := rt.s.ctl.Snapshot()
	rt.mu.Lock()
	active := rt.activeTenantsLocked()
	rt.mu.Unlock()
	var sum int64
	for name := range active {
		if t, ok := cat.Tenants[name]; ok {
			sum += committed(t.Quotas.GuestCPUMillicores, rt.cpuBudget)
		}
	}
	if sum > rt.cpuBudget {
		rt.s.log.Warn("the running tenants' guest CPU shares exceed the host's guest CPU budget: they were admitted before; new starts and raises are refused until it fits",
			"committed_millicores", sum, "budget_millicores", rt.cpuBudget, "tenants", len(active))
	}
}
