package http_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/connector/gen"
	webhook "github.com/clink-wasm/clink-wasm/host/connector/http"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// receiver is a deduplicating webhook receiver that fails the first attempt of about a
// third of the keys with 503.
type receiver struct {
	mu       sync.Mutex
	byKey    map[string]string
	tried    map[string]bool
	requests int
	dups     int
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	key := req.Header.Get("Idempotency-Key")
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	if r.tried == nil {
		r.tried = map[string]bool{}
	}
	if !r.tried[key] && len(key) > 0 && key[0]%3 == 0 {
		r.tried[key] = true
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if key == "" {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if old, ok := r.byKey[key]; ok {
		r.dups++
		if old != string(body) {
			panic("one key, two bodies: " + old + " / " + string(body))
		}
		return
	}
	r.byKey[key] = string(body)
}

func (r *receiver) lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, v := range r.byKey {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

func spec(name, url string, count int, rate float64, sink string) string {
	wasm, _ := filepath.Abs("../../../examples/wasm/counter/counter-as.wasm")
	return fmt.Sprintf(`
name: %s
checkpoints: {interval: 30ms}
sources: [{name: g, type: generator, seed: 5, splits: 1, count: %d, rate: %v, keys: 40}]
operators: [{name: count, module: %s, inputs: [g], key: key, parallelism: 2}]
sinks: [{name: out, %s, inputs: [count]}]
`, name, count, rate, wasm, strings.ReplaceAll(sink, "URL", url))
}

func run(t *testing.T, yaml string, env pipeline.Env, stopAfter time.Duration) pipeline.JobMetrics {
	t.Helper()
	s, err := pipeline.ParseSpec([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	j, err := pipeline.Start(context.Background(), s, env)
	if err != nil {
		t.Fatal(err)
	}
	if stopAfter > 0 {
		time.Sleep(stopAfter) // a stop at an arbitrary moment; the assertions do not depend on it
		j.Stop(context.Background(), false)
	}
	m, err := j.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestWebhookExactlyOnceEffect: with retries, a stop mid-run and a restore, a deduplicating
// receiver ends with exactly the records of an uninterrupted run. (One split: with several, the
// order in which a key's records from different splits meet is not fixed, and neither is
// which record produced which count.)
func TestWebhookExactlyOnceEffect(t *testing.T) {
	c := &pipeline.Connectors{}
	gen.Register(c)
	webhook.Register(c)
	sinkSpec := "type: webhook, url: URL, backoff: 1ms, max_backoff: 5ms, max_in_flight: 4"

	ref := &receiver{byKey: map[string]string{}}
	refSrv := httptest.NewServer(ref)
	defer refSrv.Close()
	run(t, spec("ref", refSrv.URL, 600, 0, sinkSpec), pipeline.Env{Connectors: c, StateURL: "mem://"}, 0)

	got := &receiver{byKey: map[string]string{}}
	srv := httptest.NewServer(got)
	defer srv.Close()
	env := pipeline.Env{Connectors: c, StateURL: "file://" + t.TempDir()}
	run(t, spec("job", srv.URL, 600, 2000, sinkSpec), env, 150*time.Millisecond)
	env.Restore = "if-any"
	m := run(t, spec("job", srv.URL, 600, 0, sinkSpec), env, 0)
	if m.State != pipeline.JobFinished {
		t.Fatalf("state %s", m.State)
	}
	if len(ref.byKey) != 600 || !slices.Equal(got.lines(), ref.lines()) {
		t.Fatalf("receiver holds %d records, the reference %d", len(got.byKey), len(ref.byKey))
	}
	t.Logf("%d requests, %d duplicates deduplicated, %d keys", got.requests, got.dups, len(got.byKey))
}

func TestWebhookPermanentFailure(t *testing.T) {
	c := &pipeline.Connectors{}
	gen.Register(c)
	webhook.Register(c)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusForbidden) }))
	defer srv.Close()
	s, err := pipeline.ParseSpec([]byte(spec("bad", srv.URL, 10, 0, "type: webhook, url: URL")))
	if err != nil {
		t.Fatal(err)
	}
	j, err := pipeline.Start(context.Background(), s, pipeline.Env{Connectors: c, StateURL: "mem://"})
	if err != nil {
		t.Fatal(err)
	}
	var de *webhook.DeliveryError
	if _, err := j.Wait(); !errors.As(err, &de) || de.Status != 403 || de.Retryable || !strings.Contains(err.Error(), "sink out[") {
		t.Fatalf("want a 403 delivery error, got %v", err)
	}
	// Bad options name their fields.
	s, _ = pipeline.ParseSpec([]byte(spec("bad", "ftp://x", 10, 0, "type: webhook, url: URL, max_attempts: 0")))
	_, err = pipeline.Start(context.Background(), s, pipeline.Env{Connectors: c, StateURL: "mem://"})
	if err == nil || !strings.Contains(err.Error(), "sinks[0].url") || !strings.Contains(err.Error(), "sinks[0].max_attempts") {
		t.Fatalf("option errors: %v", err)
	}
}
