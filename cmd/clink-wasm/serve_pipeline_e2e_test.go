package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// e2eRecords is one record for each of keys users.
func e2eRecords(keys, seq int) []byte {
	var b bytes.Buffer
	for k := 0; k < keys; k++ {
		fmt.Fprintf(&b, "{\"user\":\"u%d\",\"seq\":%d}\n", k, seq)
	}
	return b.Bytes()
}

// ingestBatch posts batch seq with its idempotency key, retrying 429/503 as told (bounded).
func ingestBatch(t *testing.T, srv *serverProc, tok, id string, keys, seq int) {
	t.Helper()
	for range 500 {
		code, b := srv.callH(t, "POST", "/api/v1/pipelines/"+id+"/records", tok, "application/x-ndjson", e2eRecords(keys, seq), map[string]string{"Idempotency-Key": fmt.Sprintf("batch-%d", seq)})
		switch code {
		case 200:
			return
		case 429, 503:
			time.Sleep(20 * time.Millisecond)
			continue
		default:
			t.Fatalf("ingest batch %d: %d %s", seq, code, b)
		}
	}
	t.Fatalf("ingest batch %d: still refused", seq)
}

func outputOf(t *testing.T, srv *serverProc, tok, id string) []string {
	t.Helper()
	code, b := srv.call(t, "GET", "/api/v1/pipelines/"+id+"/output?limit=1000", tok, "", nil)
	if code != 200 {
		t.Fatalf("output: %d %s", code, b)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func waitOutputs(t *testing.T, srv *serverProc, tok, id string, n int) []string {
	t.Helper()
	var got []string
	for range 3000 { // bounded: ends a hung test, asserts nothing about time
		if got = outputOf(t, srv, tok, id); len(got) >= n {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("waited for %d outputs, have %d\n%s", n, len(got), srv.logs())
	return nil
}

// TestServePipelineExactlyOnce: a real server process runs a tenant's pipeline (http source,
// counter module, preview sink); records are ingested and read back, a savepoint is taken, the
// server is SIGKILLed right after more records were acknowledged, and a new process on the
// same data resumes the pipeline from its last checkpoint: every acknowledged record's output
// appears exactly once, and a retried batch is not ingested twice. Another tenant's token
// reaches none of the run-time routes.
func TestServePipelineExactlyOnce(t *testing.T) {
	data := t.TempDir()
	srv := startServer(t, data)
	tokens := map[string]string{}
	for _, name := range []string{"alpha", "beta"} {
		code, b := srv.call(t, "POST", "/api/v1/tenants", e2eAdmin, "application/json", []byte(`{"name":"`+name+`","quotas":{"api_requests_per_second":100000}}`))
		if code != 201 {
			t.Fatalf("tenant %s: %d %s", name, code, b)
		}
		var tr struct{ Token string }
		json.Unmarshal(b, &tr)
		tokens[name] = tr.Token
	}
	alpha, beta := tokens["alpha"], tokens["beta"]
	wasm, err := os.ReadFile(filepath.Join("..", "..", "host", "abi", "testdata", "counter.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	if code, b := srv.call(t, "POST", "/api/v1/modules?name=counter", alpha, "application/wasm", wasm); code != 201 {
		t.Fatalf("upload: %d %s", code, b)
	}
	spec := `{"name":"clicks","spec":{"checkpoints":{"interval":"100ms"},
		"sources":[{"name":"in","type":"http"}],
		"operators":[{"name":"count","module":"counter","inputs":["in"],"key":"user","parallelism":2}],
		"sinks":[{"name":"out","type":"preview","inputs":["count"]}]}}`
	code, b := srv.call(t, "POST", "/api/v1/pipelines", alpha, "application/json", []byte(spec))
	if code != 201 {
		t.Fatalf("create: %d %s", code, b)
	}
	var pl struct {
		ID      string
		State   string
		Running bool
		Run     *struct{ Restored, Attempts uint64 }
	}
	json.Unmarshal(b, &pl)
	base := "/api/v1/pipelines/" + pl.ID
	if code, b := srv.call(t, "POST", base+"/start", alpha, "", nil); code != 202 {
		t.Fatalf("start: %d %s", code, b)
	}
	const keys = 5
	seq := 0
	for ; seq < 10; seq++ {
		ingestBatch(t, srv, alpha, pl.ID, keys, seq)
	}
	waitOutputs(t, srv, alpha, pl.ID, keys*10)
	code, b = srv.call(t, "POST", base+"/savepoints", alpha, "", nil)
	if code != 201 {
		t.Fatalf("savepoint: %d %s", code, b)
	}
	// Another tenant's token on every run-time route: not found.
	for _, rt := range []struct{ method, sub string }{{"POST", "start"}, {"POST", "stop"}, {"POST", "savepoints"}, {"POST", "records"},
		{"GET", "output"}, {"GET", "metrics"}, {"GET", "errors"}, {"GET", "checkpoints"}} {
		if code, b := srv.call(t, rt.method, base+"/"+rt.sub, beta, "application/json", []byte("{}")); code != 404 {
			t.Errorf("beta %s %s: %d %s", rt.method, rt.sub, code, b)
		}
	}
	// More records, acknowledged; then SIGKILL at once, before they are all processed.
	for ; seq < 15; seq++ {
		ingestBatch(t, srv, alpha, pl.ID, keys, seq)
	}
	srv.kill(t)

	srv2 := startServer(t, data)
	for range 3000 { // until the resumed run's first attempt has begun (bounded)
		code, b = srv2.call(t, "GET", base, alpha, "", nil)
		pl.Run = nil
		json.Unmarshal(b, &pl)
		if pl.Run != nil && pl.Run.Attempts > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code != 200 || pl.State != "running" || !pl.Running || pl.Run == nil || pl.Run.Restored == 0 {
		t.Fatalf("after the restart the pipeline is not resumed from a checkpoint: %d %s\n%s", code, b, srv2.logs())
	}
	// A retry of an acknowledged batch is not ingested twice.
	ingestBatch(t, srv2, alpha, pl.ID, keys, 12)
	for ; seq < 20; seq++ {
		ingestBatch(t, srv2, alpha, pl.ID, keys, seq)
	}
	waitOutputs(t, srv2, alpha, pl.ID, keys*20)
	// Wait for a checkpoint that covers the whole ingest log: then all output is committed
	// and a duplicate, if any, would be in it.
	covered := false
	for i := 0; i < 3000 && !covered; i++ {
		_, mb := srv2.call(t, "GET", base+"/metrics", alpha, "", nil)
		var m struct {
			IngestBytes int64 `json:"ingest_bytes"`
		}
		json.Unmarshal(mb, &m)
		_, cb := srv2.call(t, "GET", base+"/checkpoints", alpha, "", nil)
		var cps struct {
			Items []struct {
				Positions map[string][]struct {
					Position struct{ Offset int64 }
				}
			}
		}
		json.Unmarshal(cb, &cps)
		if n := len(cps.Items); n > 0 && m.IngestBytes > 0 {
			if ps := cps.Items[n-1].Positions["in"]; len(ps) == 1 && ps[0].Position.Offset == m.IngestBytes {
				covered = true
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !covered {
		t.Fatal("no checkpoint came to cover the ingest log")
	}
	got := outputOf(t, srv2, alpha, pl.ID)
	var want []string
	for c := 1; c <= 20; c++ {
		for range keys {
			want = append(want, fmt.Sprintf(`{"count":%d}`, c))
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("not exactly once: got %d outputs, want %d\n got %v\nwant %v", len(got), len(want), got, want)
	}
	code, b = srv2.call(t, "GET", base+"/checkpoints", alpha, "", nil)
	if code != 200 || !bytes.Contains(b, []byte(`"latest":{"id":`)) {
		t.Fatalf("checkpoints: %d %s", code, b)
	}
	// The CLI's run-time commands.
	env := []string{"CLINK_SERVER=" + srv2.base, "CLINK_TOKEN=" + alpha}
	if code, out, stderr := cli(t, env, "pipeline", "output", pl.ID, "--limit", "5"); code != 0 || strings.Count(out, `{"count":`) != 5 {
		t.Fatalf("pipeline output: %d %q %s", code, out, stderr)
	}
	if code, out, stderr := cli(t, env, "pipeline", "logs", pl.ID); code != 0 || !strings.Contains(out, "no errors") {
		t.Fatalf("pipeline logs: %d %q %s", code, out, stderr)
	}
	if code, out, stderr := cli(t, env, "pipeline", "rescale", pl.ID, "count=3"); code != 0 || !strings.Contains(out, `"parallelism": 3`) {
		t.Fatalf("pipeline rescale: %d %q %s", code, out, stderr)
	}
	if code, _, stderr := cli(t, env, "pipeline", "rescale", pl.ID, "count"); code != exitUsage {
		t.Fatalf("pipeline rescale without =N: %d %s", code, stderr)
	}
	if code, b := srv2.call(t, "POST", base+"/stop", alpha, "application/json", []byte(`{"savepoint":true}`)); code != 200 {
		t.Fatalf("stop: %d %s", code, b)
	}
}
