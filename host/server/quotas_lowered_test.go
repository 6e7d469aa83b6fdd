package server

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestLoweredAdmissionQuotas: max_pipelines and max_subtasks lowered below what a tenant uses
// stop nothing, and the tenant is reported over them; what would add usage is refused (a new
// pipeline, a rescale up, the start of a stopped pipeline), what does not is accepted (a
// rescale down, the running pipelines' resumption after a server restart).
func TestLoweredAdmissionQuotas(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", map[string]any{"api_requests_per_second": 1000000, "max_pipelines": 3, "max_subtasks": 16})
	if r := e.upload(tok, "?name=counter", fixture(t, "counter.wasm")); r.code != 201 {
		t.Fatalf("upload: %d %s", r.code, r.body)
	}
	var ids []string
	for _, name := range []string{"p1", "p2"} {
		r := e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": name, "spec": runtimeSpecFor("counter")}) // 4 subtasks
		if r.code != 201 {
			t.Fatalf("create %s: %d %s", name, r.code, r.body)
		}
		var p PipelineView
		r.decode(t, &p)
		if r := e.do("POST", "/api/v1/pipelines/"+p.ID+"/start", tok, "", nil); r.code != 202 {
			t.Fatalf("start %s: %d %s", name, r.code, r.body)
		}
		ids = append(ids, p.ID)
	}
	over := func(e *env) map[string]QuotaExcess {
		t.Helper()
		r := e.json("GET", "/api/v1/tenants/acme", tok, nil)
		var v TenantView
		r.decode(t, &v)
		m := map[string]QuotaExcess{}
		for _, x := range v.OverQuota {
			m[x.Quota] = x
		}
		return m
	}
	if o := over(e); len(o) != 0 {
		t.Fatalf("within its quotas, the tenant is reported over %v", o)
	}
	running := func(e *env, id string) bool {
		t.Helper()
		var p PipelineView
		e.do("GET", "/api/v1/pipelines/"+id, tok, "", nil).decode(t, &p)
		return p.Running && p.Run != nil && (p.Run.State == "running" || p.Run.State == "starting")
	}

	r := e.json("PATCH", "/api/v1/tenants/acme", testAdmin, map[string]any{"quotas": map[string]any{"max_subtasks": 4, "max_pipelines": 1}})
	var v TenantView
	r.decode(t, &v)
	if r.code != 200 || len(v.OverQuota) != 2 {
		t.Fatalf("PATCH below usage: %d %s", r.code, r.body)
	}
	if o := over(e); o["max_subtasks"] != (QuotaExcess{"max_subtasks", 8, 4}) || o["max_pipelines"] != (QuotaExcess{"max_pipelines", 2, 1}) {
		t.Fatalf("over quota: %+v", o)
	}
	if !strings.Contains(e.logs.String(), "tenant over a lowered quota") {
		t.Fatalf("no warning logged: %s", e.logs.String())
	}
	for _, id := range ids {
		if !running(e, id) {
			t.Fatalf("pipeline %s stopped when the quota was lowered", id)
		}
	}
	// What adds usage is refused, naming the quota.
	if r := e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": "p3", "spec": runtimeSpecFor("counter")}); r.code != 422 || r.problem(t).Field != "quotas.max_pipelines" {
		t.Fatalf("create over max_pipelines: %d %s", r.code, r.body)
	}
	p1 := "/api/v1/pipelines/" + ids[0]
	if r := e.json("POST", p1+"/rescale", tok, map[string]any{"parallelism": map[string]int{"count": 3}}); r.code != 422 || r.problem(t).Field != "quotas.max_subtasks" {
		t.Fatalf("rescale up over max_subtasks: %d %s", r.code, r.body)
	}
	// A rescale down is accepted though the tenant stays over (3 + 4 > 4).
	if r := e.json("POST", p1+"/rescale", tok, map[string]any{"parallelism": map[string]int{"count": 1}}); r.code != 200 {
		t.Fatalf("rescale down while over: %d %s", r.code, r.body)
	}
	waitFor(t, "p1 running after the rescale down", func() bool { return running(e, ids[0]) })
	if o := over(e); o["max_subtasks"].Used != 7 {
		t.Fatalf("after the rescale down: %+v", o)
	}

	// A restarted server resumes both: they were admitted before the quota was lowered.
	e.srv.Close(context.Background())
	e2 := openEnv(t, e.dir)
	for _, id := range ids {
		waitFor(t, "pipeline "+id+" resumed", func() bool { return running(e2, id) })
	}

	// A stopped pipeline is a new admission: its start must fit beside the running ones.
	p2 := "/api/v1/pipelines/" + ids[1]
	if r := e2.json("POST", p2+"/stop", tok, map[string]any{"savepoint": true}); r.code != 200 {
		t.Fatalf("stop p2: %d %s", r.code, r.body)
	}
	r = e2.do("POST", p2+"/start", tok, "", nil)
	if pr := r.problem(t); r.code != 422 || pr.Field != "quotas.max_subtasks" || !strings.Contains(pr.Detail, "runs 3 of its 4") {
		t.Fatalf("start over max_subtasks: %d %s", r.code, r.body)
	}
	// Back within the quotas, nothing is reported and the start is accepted.
	r = e2.json("PATCH", "/api/v1/tenants/acme", testAdmin, map[string]any{"quotas": map[string]any{"max_subtasks": 16, "max_pipelines": 3}})
	if r.code != 200 || strings.Contains(string(r.body), "over_quota") {
		t.Fatalf("PATCH back: %d %s", r.code, r.body)
	}
	if r := e2.do("POST", p2+"/start", tok, "", nil); r.code != 202 {
		t.Fatalf("start within the quota: %d %s", r.code, r.body)
	}
	var raw map[string]json.RawMessage
	e2.json("GET", "/api/v1/tenants/acme", tok, nil).decode(t, &raw)
	if _, ok := raw["over_quota"]; ok {
		t.Fatalf("over_quota shown within the quotas: %s", raw["over_quota"])
	}
}
