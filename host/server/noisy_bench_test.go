package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/control"
)

// benchServer is a server with the runtime on a temporary directory, for benchmarks.
type benchServer struct {
	b   *testing.B
	srv *Server
	h   http.Handler
}

func newBenchServer(b *testing.B) *benchServer {
	dir := b.TempDir()
	ctx := context.Background()
	st, err := control.OpenFileStore(dir)
	if err != nil {
		b.Fatal(err)
	}
	ctl, err := control.Open(ctx, st)
	if err != nil {
		b.Fatal(err)
	}
	srv, _, err := New(ctx, ctl, Config{AdminToken: testAdmin, DataURL: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Close(ctx) })
	return &benchServer{b: b, srv: srv, h: srv.Handler()}
}

func (s *benchServer) call(method, path, tok, ctype string, body []byte, want int) []byte {
	req := httptest.NewRequest(method, path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	w := httptest.NewRecorder()
	s.h.ServeHTTP(w, req)
	if w.Code != want {
		s.b.Fatalf("%s %s: %d %s", method, path, w.Code, w.Body.Bytes())
	}
	return w.Body.Bytes()
}

func (s *benchServer) callJSON(method, path, tok string, v any, want int) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		s.b.Fatal(err)
	}
	return s.call(method, path, tok, "application/json", b, want)
}

func (s *benchServer) tenant(name string, quotas map[string]any) string {
	var out struct{ Token string }
	json.Unmarshal(s.callJSON("POST", "/api/v1/tenants", testAdmin, map[string]any{"name": name, "quotas": quotas}, 201), &out)
	return out.Token
}

func (s *benchServer) pipeline(tok, module string, spec map[string]any) string {
	bin, err := os.ReadFile(filepath.Join("..", "abi", "testdata", module+".wasm"))
	if err != nil {
		s.b.Fatal(err)
	}
	s.call("POST", "/api/v1/modules?name="+module, tok, "application/wasm", bin, 201)
	var p PipelineView
	json.Unmarshal(s.callJSON("POST", "/api/v1/pipelines", tok, map[string]any{"name": module, "spec": spec}, 201), &p)
	return p.ID
}

// sinkRecords is how many records pipeline id's sinks have received.
func (s *benchServer) sinkRecords(id string) int64 {
	r := s.srv.rt.active(id)
	if r == nil {
		s.b.Fatalf("pipeline %s is not running", id)
	}
	var n int64
	for _, sk := range r.job.Metrics().Sinks {
		n += sk.RecordsIn
	}
	return n
}

// phase drives tenant b's pipeline closed-loop for d: post a batch, wait until its sink has
// all of it, again. It returns records per second and the median batch latency (post to sink).
func (s *benchServer) phase(tok, id string, batch []byte, perBatch int, d time.Duration) (float64, time.Duration) {
	base := "/api/v1/pipelines/" + id + "/records"
	want := s.sinkRecords(id)
	var lats []time.Duration
	start := time.Now()
	for time.Since(start) < d {
		t0 := time.Now()
		s.call("POST", base, tok, "application/x-ndjson", batch, 200)
		want += int64(perBatch)
		for s.sinkRecords(id) < want {
			time.Sleep(200 * time.Microsecond)
		}
		lats = append(lats, time.Since(t0))
	}
	el := time.Since(start)
	slices.Sort(lats)
	return float64(len(lats)*perBatch) / el.Seconds(), lats[len(lats)/2]
}

// BenchmarkNoisyNeighbour: tenant b's throughput and latency (a closed-loop ingest → counter
// → preview pipeline) alone; then while tenant a runs a CPU-heavy pipeline (a generator at full
// speed into the burn operator at parallelism 2, its max_subtasks) with no CPU quota
// (guest_cpu_millicores 0); then with a's CPU quota at one core (a live PATCH); then alone
// again, in one run. The figures are b-noisy/alone (a at its quota) and
// b-noisy-unbounded/alone: b's throughput with the neighbour over its throughput alone (the
// mean of the two alone phases, which bracket the others against drift).
func BenchmarkNoisyNeighbour(b *testing.B) {
	const phaseDur = 2 * time.Second
	for range b.N {
		s := newBenchServer(b)
		tokB := s.tenant("b", map[string]any{"api_requests_per_second": 1000000})
		tokA := s.tenant("a", map[string]any{"api_requests_per_second": 1000000, "max_subtasks": 4, "max_in_flight_records": 128, "guest_cpu_millicores": 0})
		idB := s.pipeline(tokB, "counter", map[string]any{
			"checkpoints": map[string]any{"interval": "1s"},
			"sources":     []any{map[string]any{"name": "in", "type": "http"}},
			"operators":   []any{map[string]any{"name": "count", "module": "counter", "inputs": []any{"in"}, "key": "user"}},
			"sinks":       []any{map[string]any{"name": "out", "type": "preview", "inputs": []any{"count"}}},
		})
		idA := s.pipeline(tokA, "burn", map[string]any{
			"checkpoints": map[string]any{"interval": "1s"},
			"sources":     []any{map[string]any{"name": "gen", "type": "generator", "kind": "counter", "keys": 1000}},
			"operators":   []any{map[string]any{"name": "burn", "module": "burn", "inputs": []any{"gen"}, "key": "key", "parallelism": 2}},
			"sinks":       []any{map[string]any{"name": "out", "type": "discard", "inputs": []any{"burn"}}},
		})
		s.call("POST", "/api/v1/pipelines/"+idB+"/start", tokB, "", nil, 202)
		const keys, perKey = 50, 4
		batch := records(keys, perKey, 0)
		s.phase(tokB, idB, batch, keys*perKey, phaseDur/4) // warm up
		thr1, lat1 := s.phase(tokB, idB, batch, keys*perKey, phaseDur)

		s.call("POST", "/api/v1/pipelines/"+idA+"/start", tokA, "", nil, 202)
		// A runs once its source has produced past what the channels buffer (the operators'
		// own counters are published only when their runners wait, which a busy one never does).
		aSource := func() int64 {
			r := s.srv.rt.active(idA)
			if r == nil {
				return 0
			}
			var n int64
			for _, src := range r.job.Metrics().Sources {
				n += src.RecordsIn
			}
			return n
		}
		for i := 0; aSource() < 20000; i++ {
			if i > 6000 {
				b.Fatal("tenant a's pipeline does not run")
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Unbounded first (guest_cpu_millicores 0), then at a's quota of one core (a live PATCH).
		a0 := aSource()
		thrU, latU := s.phase(tokB, idB, batch, keys*perKey, phaseDur)
		aRecsU := aSource() - a0
		s.callJSON("PATCH", "/api/v1/tenants/a", testAdmin, map[string]any{"quotas": map[string]any{"guest_cpu_millicores": 1000}}, 200)
		a0 = aSource()
		thrN, latN := s.phase(tokB, idB, batch, keys*perKey, phaseDur)
		aRecs := aSource() - a0
		s.callJSON("POST", "/api/v1/pipelines/"+idA+"/stop", tokA, map[string]any{"savepoint": false}, 200)

		thr2, lat2 := s.phase(tokB, idB, batch, keys*perKey, phaseDur)
		alone := (thr1 + thr2) / 2
		b.ReportMetric(alone, "b-alone-rec/s")
		b.ReportMetric(thrN, "b-noisy-rec/s")
		b.ReportMetric(thrN/alone, "b-noisy/alone")
		b.ReportMetric(float64((lat1+lat2)/2)/1e6, "b-alone-p50-ms")
		b.ReportMetric(float64(latN)/1e6, "b-noisy-p50-ms")
		b.ReportMetric(float64(aRecs)/phaseDur.Seconds(), "a-rec/s")
		b.ReportMetric(thrU/alone, "b-noisy-unbounded/alone")
		b.ReportMetric(float64(latU)/1e6, "b-noisy-unbounded-p50-ms")
		b.ReportMetric(float64(aRecsU)/phaseDur.Seconds(), "a-unbounded-rec/s")
	}
}
