package server

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// TestLookupGateRule checks the documented rule on the bubble's clock: bursts of a tenth of a
// second's worth, then one lookup per 1/rate in arrival order, waits of at most a second, and
// refusals (with the codes the guest sees) beyond that and at a quota of 0.
func TestLookupGateRule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &lookupGate{tenant: "a", rate: 10} // burst 1, one per 100 ms
		ctx := context.Background()
		var admitted, refused atomic.Int64
		var lastErr atomic.Value
		ask := func() {
			g.Admit(ctx, func(err error) {
				if err != nil {
					refused.Add(1)
					lastErr.Store(err)
					return
				}
				admitted.Add(1)
			})
		}
		for range 12 {
			ask()
		}
		// 1 at once, 10 waiting (100 ms .. 1 s), the 12th would wait 1.1 s: refused.
		if admitted.Load() != 1 || refused.Load() != 1 {
			t.Fatalf("at once: %d admitted, %d refused; want 1 and 1", admitted.Load(), refused.Load())
		}
		if err := lastErr.Load().(error); !errors.Is(err, abi.LookupUnavailable) || !strings.Contains(err.Error(), "lookup_requests_per_second") {
			t.Fatalf("refusal: %v", err)
		}
		time.Sleep(350 * time.Millisecond)
		synctest.Wait()
		if got := admitted.Load(); got != 4 {
			t.Fatalf("after 350 ms: %d admitted, want 4 (one per 100 ms)", got)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := admitted.Load(); got != 11 {
			t.Fatalf("after 1.35 s: %d admitted, want 11", got)
		}
		// A raised rate applies to the next lookup: 1000/s has bursts of 100.
		g.setRate(1000)
		time.Sleep(time.Second) // let the bucket refill
		for range 100 {
			ask()
		}
		if got := admitted.Load(); got != 111 {
			t.Fatalf("a burst at 1000/s: %d admitted at once, want 111", got)
		}
		// A waiting lookup whose context ends is cancelled, not admitted.
		cctx, cancel := context.WithCancel(ctx)
		g.setRate(1)
		time.Sleep(time.Second)
		g.Admit(cctx, func(error) {}) // takes the one token
		var cancelled atomic.Value
		g.Admit(cctx, func(err error) { cancelled.Store(err) })
		cancel()
		synctest.Wait()
		if err, _ := cancelled.Load().(error); !errors.Is(err, abi.LookupCancelled) {
			t.Fatalf("a cancelled wait: %v", err)
		}
		g.setRate(0)
		ask()
		if err := lastErr.Load().(error); !errors.Is(err, abi.LookupRefused) || !strings.Contains(err.Error(), "quota is 0") {
			t.Fatalf("at 0: %v", err)
		}
	})
}

// TestQuotasReachRunningPipeline: a PATCH of the tenant's quotas changes a running pipeline's
// operator limits and hot tier without a restart, and the lowered CPU quota stops a runaway
// guest that the quota it started under would have let run for a minute.
func TestQuotasReachRunningPipeline(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", map[string]any{"api_requests_per_second": 1000000, "cpu_time_per_record_ms": 60000})
	if r := e.upload(tok, "?name=spin", fixture(t, "loop.wasm")); r.code != 201 {
		t.Fatalf("upload: %d %s", r.code, r.body)
	}
	spec := map[string]any{
		"restart":   map[string]any{"strategy": "none"},
		"sources":   []any{map[string]any{"name": "in", "type": "http"}},
		"operators": []any{map[string]any{"name": "spin", "module": "spin", "inputs": []any{"in"}, "key": "user", "parallelism": 2}},
		"sinks":     []any{map[string]any{"name": "out", "type": "preview", "inputs": []any{"spin"}}},
	}
	r := e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": "spin", "spec": spec})
	if r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	var p PipelineView
	r.decode(t, &p)
	base := "/api/v1/pipelines/" + p.ID
	if r := e.do("POST", base+"/start", tok, "", nil); r.code != 202 {
		t.Fatalf("start: %d %s", r.code, r.body)
	}
	run := e.srv.rt.active(p.ID)
	if l := run.job.Limits()["spin"]; l.CallTimeout.D() != time.Minute || l.MaxInFlight != 5000 {
		t.Fatalf("limits at the start: %+v", l)
	}
	if r := e.json("PATCH", "/api/v1/tenants/acme", testAdmin, map[string]any{"quotas": map[string]any{
		"cpu_time_per_record_ms": 50, "max_in_flight_records": 16, "guest_memory_bytes": 4 << 20, "hot_tier_bytes": 1 << 20}}); r.code != 200 {
		t.Fatalf("patch: %d %s", r.code, r.body)
	}
	if e.srv.rt.active(p.ID) != run {
		t.Fatal("the quota change restarted the run")
	}
	want := pipeline.LimitsSpec{MemoryPages: 64, CallTimeout: pipeline.Duration(50 * time.Millisecond), MaxInFlight: 8}
	if l := run.job.Limits()["spin"]; l != want {
		t.Fatalf("limits after the PATCH: %+v, want %+v", l, want)
	}
	if got := run.store.HotBytes(); got != 1<<20 {
		t.Fatalf("hot tier budget %d after the PATCH, want %d", got, 1<<20)
	}
	e.ingest(tok, p.ID, records(1, 1, 0))
	waitFor(t, "the pipeline to fail", func() bool { return !run.running() })
	<-run.done
	r = e.do("GET", base+"/errors", tok, "", nil)
	if !strings.Contains(string(r.body), "50ms") {
		t.Fatalf("errors do not name the live 50ms limit: %s", r.body)
	}
}

// TestStateBytesQuota: a pipeline whose checkpoint finds its tenant over its state_bytes quota
// fails naming the quota, a start is refused while the tenant is over, and a raised quota lets
// it start again.
func TestStateBytesQuota(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", map[string]any{"api_requests_per_second": 1000000, "state_bytes": 1})
	if r := e.upload(tok, "?name=counter", fixture(t, "counter.wasm")); r.code != 201 {
		t.Fatalf("upload: %d %s", r.code, r.body)
	}
	r := e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": "clicks", "spec": runtimeSpecFor("counter")})
	if r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	var p PipelineView
	r.decode(t, &p)
	base := "/api/v1/pipelines/" + p.ID
	if r := e.do("POST", base+"/start", tok, "", nil); r.code != 202 {
		t.Fatalf("start with no state yet: %d %s", r.code, r.body)
	}
	run := e.srv.rt.active(p.ID)
	e.ingest(tok, p.ID, records(5, 2, 0))
	waitFor(t, "the pipeline to stop over its quota", func() bool { return !run.running() })
	<-run.done
	r = e.do("GET", base, tok, "", nil)
	r.decode(t, &p)
	if p.State != "failed" || p.Running || !strings.Contains(p.Error, "quotas.state_bytes") {
		t.Fatalf("after going over: state %s running %v error %q", p.State, p.Running, p.Error)
	}
	if r := e.do("POST", base+"/start", tok, "", nil); r.code != 422 || r.problem(t).Field != "quotas.state_bytes" {
		t.Fatalf("start over the quota: %d %s", r.code, r.body)
	}
	r = e.do("GET", "/api/v1/tenants/acme", tok, "", nil)
	var tv TenantView
	r.decode(t, &tv)
	if tv.Usage.StateBytes == nil || *tv.Usage.StateBytes <= 1 {
		t.Fatalf("usage does not show the state: %s", r.body)
	}
	e.json("PATCH", "/api/v1/tenants/acme", testAdmin, map[string]any{"quotas": map[string]any{"state_bytes": 1 << 30}})
	if r := e.do("POST", base+"/start", tok, "", nil); r.code != 202 {
		t.Fatalf("start under a raised quota: %d %s", r.code, r.body)
	}
}
