package server

import (
	"context"
	"strings"
	"testing"
)

// TestRunHistorySurvivesRestart: a pipeline's captured errors and checkpoint history are
// there after the server restarts (not running, then continued by a new run), and deleting the
// pipeline deletes them.
func TestRunHistorySurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	e := openEnv(t, dir)
	tok := e.tenant("acme", map[string]any{"api_requests_per_second": 1000000})
	for _, m := range []string{"counter", "trap"} {
		if r := e.upload(tok, "?name="+m, fixture(t, m+".wasm")); r.code != 201 {
			t.Fatalf("upload %s: %d %s", m, r.code, r.body)
		}
	}
	create := func(name string, spec map[string]any) string {
		r := e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": name, "spec": spec})
		if r.code != 201 {
			t.Fatalf("create: %d %s", r.code, r.body)
		}
		var p PipelineView
		r.decode(t, &p)
		return p.ID
	}
	counter := create("clicks", runtimeSpecFor("counter"))
	trapSpec := runtimeSpecFor("trap")
	trapSpec["restart"] = map[string]any{"strategy": "none"}
	trap := create("traps", trapSpec)
	for _, id := range []string{counter, trap} {
		if r := e.do("POST", "/api/v1/pipelines/"+id+"/start", tok, "", nil); r.code != 202 {
			t.Fatalf("start: %d %s", r.code, r.body)
		}
		if r := e.do("POST", "/api/v1/pipelines/"+id+"/records", tok, "application/x-ndjson", records(3, 1, 0)); r.code != 200 {
			t.Fatalf("ingest: %d %s", r.code, r.body)
		}
	}
	waitFor(t, "the trap to fail", func() bool { return e.srv.rt.active(trap) == nil })
	r := e.do("POST", "/api/v1/pipelines/"+counter+"/savepoints", tok, "", nil)
	if r.code != 201 {
		t.Fatalf("savepoint: %d %s", r.code, r.body)
	}
	var sp struct{ Savepoint uint64 }
	r.decode(t, &sp)
	beforeErrs := e.do("GET", "/api/v1/pipelines/"+trap+"/errors", tok, "", nil)
	if !strings.Contains(string(beforeErrs.body), "negative amount") {
		t.Fatalf("no captured error before the restart: %s", beforeErrs.body)
	}
	e.srv.Close(context.Background())

	e2 := openEnv(t, dir)
	// The failed pipeline does not run; its errors are still there.
	if r := e2.do("GET", "/api/v1/pipelines/"+trap+"/errors", tok, "", nil); r.code != 200 || !strings.Contains(string(r.body), "negative amount") || !strings.Contains(string(r.body), `"operator"`) {
		t.Fatalf("errors after the restart: %d %s", r.code, r.body)
	}
	// The counter resumed; its new run continues the history, the savepoint included.
	waitFor(t, "the counter to resume", func() bool { return e2.srv.rt.active(counter) != nil })
	var cps struct {
		Items []CheckpointView `json:"items"`
	}
	e2.do("GET", "/api/v1/pipelines/"+counter+"/checkpoints", tok, "", nil).decode(t, &cps)
	found := false
	for _, c := range cps.Items {
		found = found || (c.ID == sp.Savepoint && c.Savepoint)
	}
	if !found {
		t.Fatalf("savepoint %d is not in the history after the restart: %+v", sp.Savepoint, cps.Items)
	}
	if r := e2.do("DELETE", "/api/v1/pipelines/"+trap, tok, "", nil); r.code != 204 {
		t.Fatalf("delete: %d %s", r.code, r.body)
	}
	if _, _, err := e2.ctl.Store().Get(context.Background(), historyName("acme", trap)); err == nil {
		t.Fatal("the deleted pipeline's history is still stored")
	}
}
