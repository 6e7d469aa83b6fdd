package server

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/control"
)

// TestCPUBudgetFits: the committed CPU is the other active tenants' quotas (0 counting as the
// whole budget) plus the tenant's own; exactly the budget fits, one millicore more does not.
func TestCPUBudgetFits(t *testing.T) {
	cat := &control.Catalog{Tenants: map[string]*control.Tenant{
		"a": {Name: "a", Quotas: control.Quotas{GuestCPUMillicores: 1000}},
		"b": {Name: "b", Quotas: control.Quotas{GuestCPUMillicores: 500}},
		"u": {Name: "u", Quotas: control.Quotas{GuestCPUMillicores: 0}},
	}}
	for _, c := range []struct {
		name       string
		active     []string
		tenant     string
		millicores int64
		budget     int64
		ok         bool
	}{
		{"alone", nil, "a", 1000, 2000, true},
		{"exactly the budget", []string{"a", "b"}, "c", 500, 2000, true},
		{"one over", []string{"a", "b"}, "c", 501, 2000, false},
		{"itself is not counted twice", []string{"a", "b"}, "a", 1500, 2000, true},
		{"unbounded tenant takes all", []string{"u"}, "c", 1, 2000, false},
		{"unbounded alone fits", nil, "u", 0, 2000, true},
		{"unbounded beside another", []string{"b"}, "u", 0, 2000, false},
		{"no budget", []string{"u", "a"}, "c", 5000, 0, true},
	} {
		active := map[string]bool{}
		for _, n := range c.active {
			active[n] = true
		}
		err := cpuFits(cat, active, c.tenant, c.millicores, c.budget)
		if (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok=%v", c.name, err, c.ok)
			continue
		}
		if err != nil {
			pr, ok := err.(*Problem)
			if !ok || pr.Status != 409 || pr.Code != CodeCPUOvercommitted || pr.Field != "quotas.guest_cpu_millicores" {
				t.Errorf("%s: %#v", c.name, err)
			}
		}
	}
	if got := defaultCPUBudget(-1); got != 0 {
		t.Errorf("a negative budget is no check, got %d", got)
	}
	if got := defaultCPUBudget(0); got < 1000 || got%1000 != 0 {
		t.Errorf("the default budget is the host's cores, got %d", got)
	}
}

// TestCPUBudgetAdmission: over HTTP, with a budget of 1.5 cores: starts and quota raises that
// would promise the running tenants more are refused with 409 cpu_overcommitted naming the
// field and what is left; creating tenants, a tenant's second pipeline and lowering a quota are
// not; stopping a tenant's pipelines frees its share; a restarted server resumes what runs
// even under a smaller budget, and warns.
func TestCPUBudgetAdmission(t *testing.T) {
	budget := func(mc int64) func(*Config) { return func(c *Config) { c.GuestCPUBudget = mc } }
	e := openEnv(t, t.TempDir(), budget(1500))
	toks := map[string]string{}
	for name, mc := range map[string]int{"a": 1000, "b": 1000, "c": 250} {
		toks[name] = e.tenant(name, map[string]any{"api_requests_per_second": 1000000, "guest_cpu_millicores": mc})
		if r := e.upload(toks[name], "?name=counter", fixture(t, "counter.wasm")); r.code != 201 {
			t.Fatalf("upload: %d %s", r.code, r.body)
		}
	}
	create := func(tenant, name string) string {
		t.Helper()
		r := e.json("POST", "/api/v1/pipelines", toks[tenant], map[string]any{"name": name, "spec": runtimeSpecFor("counter")})
		if r.code != 201 {
			t.Fatalf("create %s: %d %s", name, r.code, r.body)
		}
		var p PipelineView
		r.decode(t, &p)
		return p.ID
	}
	start := func(tenant, id string) resp {
		t.Helper()
		return e.do("POST", "/api/v1/pipelines/"+id+"/start", toks[tenant], "", nil)
	}
	refused := func(what string, r resp, left string) {
		t.Helper()
		pr := r.problem(t)
		if r.code != 409 || pr.Code != CodeCPUOvercommitted || pr.Field != "quotas.guest_cpu_millicores" || !strings.Contains(pr.Detail, left+" are left") {
			t.Fatalf("%s: %d %s", what, r.code, r.body)
		}
	}
	patch := func(tenant string, mc int) resp {
		return e.json("PATCH", "/api/v1/tenants/"+tenant, testAdmin, map[string]any{"quotas": map[string]any{"guest_cpu_millicores": mc}})
	}

	a1, b1, c1 := create("a", "a1"), create("b", "b1"), create("c", "c1")
	if r := start("a", a1); r.code != 202 {
		t.Fatalf("start a1: %d %s", r.code, r.body)
	}
	refused("b beside a", start("b", b1), "500")
	if r := start("c", c1); r.code != 202 {
		t.Fatalf("start c1 (1250 of 1500): %d %s", r.code, r.body)
	}
	// A second pipeline of a running tenant commits nothing more.
	if r := start("a", create("a", "a2")); r.code != 202 {
		t.Fatalf("a's second pipeline: %d %s", r.code, r.body)
	}
	// Raising a running tenant's quota must fit; to exactly the budget it does.
	refused("c raised to 600", patch("c", 600), "500")
	refused("c raised to no bound", patch("c", 0), "500")
	if r := patch("c", 500); r.code != 200 {
		t.Fatalf("c raised to 500 (1500 of 1500): %d %s", r.code, r.body)
	}
	// What runs nothing commits nothing: b's quota may rise, and new tenants have the default.
	if r := patch("b", 4000); r.code != 200 {
		t.Fatalf("raising a tenant that runs nothing: %d %s", r.code, r.body)
	}
	e.tenant("d", nil)
	// Lowering is never refused.
	if r := patch("a", 900); r.code != 200 {
		t.Fatalf("lowering: %d %s", r.code, r.body)
	}
	if r := patch("b", 1000); r.code != 200 {
		t.Fatalf("b back to 1000: %d %s", r.code, r.body)
	}
	// Stopping all of a's pipelines frees its share for b.
	for _, id := range []string{a1} {
		if r := e.json("POST", "/api/v1/pipelines/"+id+"/stop", toks["a"], map[string]any{"savepoint": false}); r.code != 200 {
			t.Fatalf("stop %s: %d %s", id, r.code, r.body)
		}
	}
	refused("b while a's second pipeline runs", start("b", b1), "100")
	var a2 string
	for _, p := range e.ctl.Snapshot().TenantPipelines("a") {
		if p.Name == "a2" {
			a2 = p.ID
		}
	}
	if r := e.json("POST", "/api/v1/pipelines/"+a2+"/stop", toks["a"], map[string]any{"savepoint": false}); r.code != 200 {
		t.Fatalf("stop a2: %d %s", r.code, r.body)
	}
	if r := start("b", b1); r.code != 202 {
		t.Fatalf("start b1 once a stopped (1500 of 1500): %d %s", r.code, r.body)
	}
	refused("a beside b and c", start("a", a1), "0")

	// A server restarted with a smaller budget resumes b and c (admitted before) and warns;
	// what was not running stays refused.
	e.srv.Close(context.Background())
	e2 := openEnv(t, e.dir, budget(1000))
	for _, id := range []string{b1, c1} {
		waitFor(t, "pipeline "+id+" resumed", func() bool { return e2.srv.rt.active(id) != nil })
	}
	waitFor(t, "the overcommit warning", func() bool {
		return strings.Contains(e2.logs.String(), "exceed the host's guest CPU budget")
	})
	if r := e2.do("POST", "/api/v1/pipelines/"+a1+"/start", toks["a"], "", nil); r.code != 409 {
		t.Fatalf("start a1 on the smaller budget: %d %s", r.code, r.body)
	}
	// With the check off, anything goes.
	e2.srv.Close(context.Background())
	e3 := openEnv(t, e.dir, budget(-1))
	if r := e3.do("POST", "/api/v1/pipelines/"+a1+"/start", toks["a"], "", nil); r.code != 202 {
		t.Fatalf("start a1 without a budget: %d %s", r.code, r.body)
	}
}

// TestObserveSink: Server.observeSink (what the noisy-neighbour benchmark waits on) sees every
// record a hosted pipeline's preview sink writes, with the sink's name, and the pipeline's own
// sink metrics agree.
func TestObserveSink(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	seen := map[string]int{}
	e.srv.observeSink = func(sink string, n int) {
		mu.Lock()
		seen[sink] += n
		mu.Unlock()
	}
	tok := e.tenant("acme", map[string]any{"api_requests_per_second": 1000000})
	if r := e.upload(tok, "?name=counter", fixture(t, "counter.wasm")); r.code != 201 {
		t.Fatalf("upload: %d %s", r.code, r.body)
	}
	p := e.startPipeline(tok, "p", runtimeSpecFor("counter"))
	e.ingest(tok, p.ID, records(7, 3, 0))
	e.ingest(tok, p.ID, records(7, 2, 3))
	sunk := func() int64 {
		var n int64
		for _, sk := range e.srv.rt.active(p.ID).job.Metrics().Sinks {
			n += sk.RecordsIn
		}
		return n
	}
	// The sink's counter moves after its write returns, the observer inside it: wait for both.
	waitFor(t, "35 records observed and counted", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen["out"] >= 35 && sunk() >= 35
	})
	mu.Lock()
	defer mu.Unlock()
	if n := sunk(); len(seen) != 1 || seen["out"] != 35 || n != 35 {
		t.Fatalf("observed %v, the sink's metrics %d; want out: 35", seen, n)
	}
}
