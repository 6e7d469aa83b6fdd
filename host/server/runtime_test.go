package server

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/connector/ingest"
)

// runtimeSpecFor is a hosted pipeline: the http source, the counter module keyed by user, and
// the preview sink, checkpointing often.
func runtimeSpecFor(module string) map[string]any {
	return map[string]any{
		"checkpoints": map[string]any{"interval": "50ms"},
		"sources":     []any{map[string]any{"name": "in", "type": "http"}},
		"operators":   []any{map[string]any{"name": "count", "module": module, "inputs": []any{"in"}, "key": "user", "parallelism": 2}},
		"sinks":       []any{map[string]any{"name": "out", "type": "preview", "inputs": []any{"count"}}},
	}
}

// startPipeline creates a pipeline named name from spec and starts it.
func (e *env) startPipeline(tok, name string, spec map[string]any) PipelineView {
	e.t.Helper()
	r := e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": name, "spec": spec})
	if r.code != 201 {
		e.t.Fatalf("create %s: %d %s", name, r.code, r.body)
	}
	var p PipelineView
	r.decode(e.t, &p)
	if r := e.do("POST", "/api/v1/pipelines/"+p.ID+"/start", tok, "", nil); r.code != 202 {
		e.t.Fatalf("start %s: %d %s", name, r.code, r.body)
	}
	return p
}

// ingest posts body (JSON Lines) to pipeline id's HTTP source.
func (e *env) ingest(tok, id string, body []byte) {
	e.t.Helper()
	if r := e.do("POST", "/api/v1/pipelines/"+id+"/records", tok, "application/x-ndjson", body); r.code != 200 {
		e.t.Fatalf("ingest: %d %s", r.code, r.body)
	}
}

// records is n records for each of keys users, as JSON Lines, from seq first on.
func records(keys, n, first int) []byte {
	var b bytes.Buffer
	for i := 0; i < n; i++ {
		for k := 0; k < keys; k++ {
			fmt.Fprintf(&b, "{\"user\":\"u%d\",\"seq\":%d}\n", k, first+i)
		}
	}
	return b.Bytes()
}

// waitFor polls cond until it holds; a bounded loop, failing after many tries (never an
// assertion on time: the bound only ends a hung test).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 3000; i++ {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("gave up waiting for %s", what)
}

func outputLines(e *env, tok, id string) []string {
	r := e.do("GET", "/api/v1/pipelines/"+id+"/output?limit=1000", tok, "", nil)
	if r.code != 200 {
		e.t.Fatalf("output: %d %s", r.code, r.body)
	}
	s := strings.TrimSpace(string(r.body))
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// wantCounts checks exactly-once output of the counter: each of keys users' counts 1..n, each
// once.
func wantCounts(t *testing.T, lines []string, keys, n int) {
	t.Helper()
	var want []string
	for c := 1; c <= n; c++ {
		for k := 0; k < keys; k++ {
			want = append(want, fmt.Sprintf(`{"count":%d}`, c))
		}
	}
	got := slices.Clone(lines)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("output is not each record's once:\n got %d lines %v\nwant %d lines %v", len(got), got, len(want), want)
	}
}

func TestPipelineRuntime(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", map[string]any{"api_requests_per_second": 1000000})
	other := e.tenant("other", map[string]any{"api_requests_per_second": 1000000})
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
	// A quota lowered below what the pipeline needs refuses the start.
	if r := e.json("PATCH", "/api/v1/tenants/acme", testAdmin, map[string]any{"quotas": map[string]any{"max_subtasks": 3}}); r.code != 200 {
		t.Fatalf("lower quota: %d %s", r.code, r.body)
	}
	if r := e.do("POST", base+"/start", tok, "", nil); r.code != 422 || r.problem(t).Field != "quotas.max_subtasks" {
		t.Fatalf("start over the quota: %d %s", r.code, r.body)
	}
	e.json("PATCH", "/api/v1/tenants/acme", testAdmin, map[string]any{"quotas": map[string]any{"max_subtasks": 16}})
	if r := e.do("POST", base+"/start", tok, "", nil); r.code != 202 {
		t.Fatalf("start: %d %s", r.code, r.body)
	}
	if r := e.do("POST", base+"/start", tok, "", nil); r.code != 409 {
		t.Fatalf("second start: %d %s", r.code, r.body)
	}
	r = e.do("GET", base, tok, "", nil)
	r.decode(t, &p)
	if p.State != "running" || !p.Running || p.Run == nil || (p.Run.State != "running" && p.Run.State != "starting") {
		t.Fatalf("after start: %s", r.body)
	}
	// Ingest: a retry with the same key is not ingested twice; a bad line ingests nothing.
	post := func(key string, body []byte) resp {
		req := httptest.NewRequest("POST", base+"/records", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/x-ndjson")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		return e.serve(req)
	}
	if r := post("batch-1", records(5, 2, 0)); r.code != 200 {
		t.Fatalf("ingest: %d %s", r.code, r.body)
	}
	if r := post("batch-1", records(5, 2, 0)); r.code != 200 || r.hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %v %s", r.code, r.hdr, r.body)
	}
	if r := post("batch-x", []byte("{\"user\":\"u0\"}\nnot json\n")); r.code != 400 || r.problem(t).Field != "body" || !strings.Contains(r.problem(t).Detail, "line 2") {
		t.Fatalf("bad line: %d %s", r.code, r.body)
	}
	if r := post("bad key", records(1, 1, 0)); r.code != 400 || r.problem(t).Field != "Idempotency-Key" {
		t.Fatalf("bad key: %d %s", r.code, r.body)
	}
	waitFor(t, "10 outputs", func() bool { return len(outputLines(e, tok, p.ID)) >= 10 })
	wantCounts(t, outputLines(e, tok, p.ID), 5, 2)

	// Another tenant sees none of it.
	for _, sub := range []string{"output", "metrics", "errors", "checkpoints"} {
		if r := e.do("GET", base+"/"+sub, other, "", nil); r.code != 404 {
			t.Errorf("other tenant GET %s: %d %s", sub, r.code, r.body)
		}
	}
	if r := e.do("POST", base+"/records", other, "application/x-ndjson", records(1, 1, 0)); r.code != 404 {
		t.Errorf("other tenant ingest: %d", r.code)
	}

	// A savepoint is recorded as the pipeline's restore point.
	r = e.do("POST", base+"/savepoints", tok, "", nil)
	var sp struct{ Savepoint uint64 }
	r.decode(t, &sp)
	if r.code != 201 || sp.Savepoint == 0 {
		t.Fatalf("savepoint: %d %s", r.code, r.body)
	}
	r = e.do("GET", base, tok, "", nil)
	r.decode(t, &p)
	if p.Checkpoint == nil || p.Checkpoint.ID < sp.Savepoint || !strings.Contains(p.Checkpoint.URL, "/state/acme/"+p.ID) {
		t.Fatalf("checkpoint pointer: %s", r.body)
	}
	r = e.do("GET", base+"/metrics", tok, "", nil)
	if r.code != 200 || !bytes.Contains(r.body, []byte(`"Operators"`)) || !bytes.Contains(r.body, []byte(`"ingest_lag_bytes"`)) {
		t.Fatalf("metrics: %d %s", r.code, r.body)
	}
	if m := readMetrics(t, e); !strings.Contains(m, `clink_pipeline_records_in_total{kind="operator",node="count",pipeline="`+p.ID+`",tenant="acme"} 10`) {
		t.Errorf("prometheus: no operator records for the pipeline:\n%s", m)
	}
	r = e.do("GET", base+"/checkpoints", tok, "", nil)
	if r.code != 200 || !bytes.Contains(r.body, []byte(fmt.Sprintf(`"id":%d,"savepoint":true`, sp.Savepoint))) {
		t.Fatalf("checkpoints: %d %s", r.code, r.body)
	}

	// follow=1 streams outputs as they are committed.
	hs := httptest.NewServer(e.http)
	defer hs.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", hs.URL+base+"/output?follow=1&limit=1", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	if !sc.Scan() { // the latest one
		t.Fatalf("follow: %v", sc.Err())
	}
	if r := post("batch-2", records(5, 1, 2)); r.code != 200 {
		t.Fatalf("ingest 2: %d %s", r.code, r.body)
	}
	var streamed []string
	for len(streamed) < 5 && sc.Scan() {
		streamed = append(streamed, sc.Text())
	}
	if got := strings.Join(streamed, ","); strings.Count(got, `{"count":3}`) != 5 {
		t.Fatalf("followed %v", streamed)
	}
	cancel()

	// A restarted server resumes the running pipeline from its last checkpoint.
	e.srv.Close(context.Background())
	e2 := openEnv(t, e.dir)
	waitFor(t, "the resumed run's attempt", func() bool {
		r = e2.do("GET", base, tok, "", nil)
		p = PipelineView{}
		r.decode(t, &p)
		return p.Run != nil && p.Run.Attempts > 0
	})
	if p.State != "running" || !p.Running || p.Run.Restored == 0 {
		t.Fatalf("after restart: %s", r.body)
	}
	if r := e2.do("POST", base+"/records", tok, "application/x-ndjson", records(5, 1, 3)); r.code != 200 {
		t.Fatalf("ingest after restart: %d %s", r.code, r.body)
	}
	waitFor(t, "20 outputs", func() bool { return len(outputLines(e2, tok, p.ID)) >= 20 })
	wantCounts(t, outputLines(e2, tok, p.ID), 5, 4)

	// stop with a savepoint: not resumed by the next server.
	r = e2.json("POST", base+"/stop", tok, map[string]any{"savepoint": true})
	if r.code != 200 || !bytes.Contains(r.body, []byte(`"state":"stopped"`)) {
		t.Fatalf("stop: %d %s", r.code, r.body)
	}
	r = e2.do("GET", base, tok, "", nil)
	r.decode(t, &p)
	if p.State != "stopped" || p.Running {
		t.Fatalf("after stop: %s", r.body)
	}
	if r := e2.do("POST", base+"/records", tok, "application/x-ndjson", records(1, 1, 0)); r.code != 503 || r.hdr.Get("Retry-After") == "" {
		t.Fatalf("ingest while stopped: %d %s", r.code, r.body)
	}
	e2.srv.Close(context.Background())
	e3 := openEnv(t, e.dir)
	r = e3.do("GET", base, tok, "", nil)
	p = PipelineView{}
	r.decode(t, &p)
	if p.State != "stopped" || p.Running || p.Run != nil {
		t.Fatalf("a stopped pipeline was resumed: %s", r.body)
	}
	wantCounts(t, outputLines(e3, tok, p.ID), 5, 4)
}

func TestRunningPipelineUpgradeAndDelete(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", map[string]any{"api_requests_per_second": 1000000})
	e.upload(tok, "?name=counter", fixture(t, "counter.wasm"))
	e.upload(tok, "?name=fast", fixture(t, "fast.wasm")) // other state names
	if r := e.upload(tok, "?name=counter&version=2", append(fixture(t, "counter.wasm"), 0, 5, 3, 'p', 'a', 'd', 0)); r.code != 201 {
		t.Fatalf("counter v2: %d %s", r.code, r.body)
	}
	p := e.startPipeline(tok, "p", runtimeSpecFor("counter@1"))
	base := "/api/v1/pipelines/" + p.ID
	e.ingest(tok, p.ID, records(5, 2, 0))
	waitFor(t, "10 outputs", func() bool { return len(outputLines(e, tok, p.ID)) >= 10 })
	// An upgrade to a module with other state names is refused while it runs.
	ops := func(module string) map[string]any {
		return map[string]any{"spec": map[string]any{"operators": []any{map[string]any{"name": "count", "module": module, "inputs": []any{"in"}, "key": "user", "parallelism": 2}}}}
	}
	if r := e.json("PATCH", base, tok, ops("fast")); r.code != 409 || r.problem(t).Code != CodeIncompatibleState {
		t.Fatalf("incompatible upgrade: %d %s", r.code, r.body)
	}
	// A compatible one restarts the pipeline from a savepoint: the counts go on.
	r := e.json("PATCH", base, tok, ops("counter@2"))
	if r.code != 200 {
		t.Fatalf("upgrade: %d %s", r.code, r.body)
	}
	// The new run's first attempt records what it restored once it begins.
	waitFor(t, "the upgraded run's attempt", func() bool {
		r = e.do("GET", base, tok, "", nil)
		p = PipelineView{}
		r.decode(t, &p)
		return p.Run != nil && p.Run.Attempts > 0
	})
	if p.Revision != 2 || !p.Running || p.Run.Restored == 0 || p.Checkpoint == nil || p.Run.Restored != p.Checkpoint.ID {
		t.Fatalf("after the upgrade: %s", r.body)
	}
	e.ingest(tok, p.ID, records(5, 1, 2))
	waitFor(t, "15 outputs", func() bool { return len(outputLines(e, tok, p.ID)) >= 15 })
	wantCounts(t, outputLines(e, tok, p.ID), 5, 3)
	// Rescale while running: a savepoint, then 3 subtasks from it; the counts go on.
	if r := e.json("POST", base+"/rescale", tok, map[string]any{"parallelism": map[string]any{"nosuch": 2}}); r.code != 400 || r.problem(t).Field != "parallelism.nosuch" {
		t.Fatalf("rescale of no operator: %d %s", r.code, r.body)
	}
	r = e.json("POST", base+"/rescale", tok, map[string]any{"parallelism": map[string]any{"count": 3}})
	if r.code != 200 {
		t.Fatalf("rescale: %d %s", r.code, r.body)
	}
	waitFor(t, "the rescaled run's operators", func() bool {
		r = e.do("GET", base+"/metrics", tok, "", nil)
		return strings.Count(string(r.body), `"Node":"count"`) == 3
	})
	e.ingest(tok, p.ID, records(5, 1, 3))
	waitFor(t, "20 outputs", func() bool { return len(outputLines(e, tok, p.ID)) >= 20 })
	wantCounts(t, outputLines(e, tok, p.ID), 5, 4)
	// Deleting a running pipeline stops it and removes its local files.
	dir, _ := e.srv.rt.runDir("acme", p.ID)
	if r := e.do("DELETE", base, tok, "", nil); r.code != 204 {
		t.Fatalf("delete: %d %s", r.code, r.body)
	}
	if r := e.do("GET", base+"/output", tok, "", nil); r.code != 404 {
		t.Fatalf("output after delete: %d", r.code)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("run dir after delete: %v", err)
	}
}

// TestIngestBackpressure: an append that would put the ingest log more than
// MaxIngestLagBytes ahead of the pipeline's reader is refused with 429 and Retry-After, and
// nothing of it is ingested; once the reader catches up, ingest is accepted again.
func TestIngestBackpressure(t *testing.T) {
	e := newEnv(t)
	e.srv.cfg.MaxIngestLagBytes = 200 // read when a run opens its log; one batch below is 121 bytes
	tok := e.tenant("acme", map[string]any{"api_requests_per_second": 1000000})
	e.upload(tok, "?name=counter", fixture(t, "counter.wasm"))
	p := e.startPipeline(tok, "p", runtimeSpecFor("counter"))
	base := "/api/v1/pipelines/" + p.ID
	e.ingest(tok, p.ID, records(5, 1, 0))
	waitFor(t, "5 outputs", func() bool { return len(outputLines(e, tok, p.ID)) >= 5 })
	// Hold the reader's position back at the start of the log, as a pipeline that has read
	// nothing would: the log is now one batch (121 bytes) ahead of it, and a second would make 242.
	run := e.srv.rt.active(p.ID)
	lagger, err := run.log.NewReader(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lagger.Close()
	before := run.log.Durable()
	r := e.do("POST", base+"/records", tok, "application/x-ndjson", records(5, 1, 1))
	if r.code != 429 || r.hdr.Get("Retry-After") == "" || r.problem(t).Code != CodeRateLimited {
		t.Fatalf("want 429 with Retry-After, got %d %v %s", r.code, r.hdr, r.body)
	}
	if run.log.Durable() != before {
		t.Fatal("a refused batch was appended")
	}
	if m := readMetrics(t, e); !strings.Contains(m, `clink_ingest_refused_total{reason="backpressure",tenant="acme"} 1`) {
		t.Errorf("refusal not counted:\n%s", m)
	}
	// The reader catches up: accepted again.
	buf := make([]ingest.Record, 64)
	for off, _ := lagger.Pos(); off < before; off, _ = lagger.Pos() {
		if _, err := lagger.Next(context.Background(), buf); err != nil {
			t.Fatal(err)
		}
	}
	if r := e.do("POST", base+"/records", tok, "application/x-ndjson", records(5, 1, 1)); r.code != 200 {
		t.Fatalf("after catching up: %d %s", r.code, r.body)
	}
	waitFor(t, "10 outputs", func() bool { return len(outputLines(e, tok, p.ID)) >= 10 })
	wantCounts(t, outputLines(e, tok, p.ID), 5, 2)
}

// TestGuestFaultFailsOnlyItsPipeline: a module that traps fails its pipeline, whose errors
// name the operator, the key and the record; the server and another tenant's pipeline go on.
func TestGuestFaultFailsOnlyItsPipeline(t *testing.T) {
	e := newEnv(t)
	bad := e.tenant("bad", map[string]any{"api_requests_per_second": 1000000})
	good := e.tenant("good", map[string]any{"api_requests_per_second": 1000000})
	if r := e.upload(bad, "?name=trap", fixture(t, "trap.wasm")); r.code != 201 {
		t.Fatalf("upload trap: %d %s", r.code, r.body)
	}
	e.upload(good, "?name=counter", fixture(t, "counter.wasm"))
	mk := func(tok, module string) string {
		r := e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": "p", "spec": runtimeSpecFor(module)})
		var p PipelineView
		r.decode(t, &p)
		if r := e.do("POST", "/api/v1/pipelines/"+p.ID+"/start", tok, "", nil); r.code != 202 {
			t.Fatalf("start: %d %s", r.code, r.body)
		}
		return p.ID
	}
	badID, goodID := mk(bad, "trap"), mk(good, "counter")
	if r := e.do("POST", "/api/v1/pipelines/"+badID+"/records", bad, "application/x-ndjson", records(1, 1, 0)); r.code != 200 {
		t.Fatalf("ingest: %d %s", r.code, r.body)
	}
	var p PipelineView
	waitFor(t, "the faulty pipeline to fail", func() bool {
		p = PipelineView{}
		e.do("GET", "/api/v1/pipelines/"+badID, bad, "", nil).decode(t, &p)
		return p.State == "failed"
	})
	if p.Running || !strings.Contains(p.Error, `negative amount`) || !strings.Contains(p.Error, `(key "u0"`) {
		t.Fatalf("failed pipeline: running %v, error %q", p.Running, p.Error)
	}
	r := e.do("GET", "/api/v1/pipelines/"+badID+"/errors", bad, "", nil)
	var errs struct {
		Items []CapturedError `json:"items"`
	}
	r.decode(t, &errs)
	if last := len(errs.Items) - 1; last < 0 || errs.Items[last].Operator == "" || errs.Items[last].Key != "u0" || errs.Items[last].Record == "" {
		t.Fatalf("errors: %s", r.body)
	}
	// The other tenant's pipeline still runs.
	if r := e.do("POST", "/api/v1/pipelines/"+goodID+"/records", good, "application/x-ndjson", records(3, 1, 0)); r.code != 200 {
		t.Fatalf("ingest good: %d %s", r.code, r.body)
	}
	waitFor(t, "the good pipeline's outputs", func() bool { return len(outputLines(e, good, goodID)) >= 3 })
}
