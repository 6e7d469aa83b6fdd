package pipeline_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/connector/file"
	"github.com/clink-wasm/clink-wasm/host/connector/stdout"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// TestExampleSession: merging event-time sessions per user; each user's sessions come in order.
func TestExampleSession(t *testing.T) {
	checkExample(t, "../../examples/wasm/session")
}

// runExampleWith runs an example's pipeline.yaml, with edit applied to the spec, over store,
// and returns its stdout lines.
func runExampleWith(t *testing.T, dir, stateURL string, edit func(*pipeline.Spec)) ([]string, state.Metrics) {
	t.Helper()
	store, err := state.Open(context.Background(), stateURL, state.WithRetainCheckpoints(8))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	data, err := os.ReadFile(filepath.Join(dir, "pipeline.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := pipeline.ParseSpec(data)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(spec)
	}
	var out lockedBuffer
	c := &pipeline.Connectors{}
	file.Register(c)
	stdout.Register(c, &out)
	j, err := pipeline.Start(context.Background(), spec, pipeline.Env{Connectors: c, BaseDir: dir, Store: store, StateURL: stateURL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Wait(); err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(out.b.String(), "\n"), "\n"), store.Metrics()
}

// checkJoin compares an interval join's output with expected.jsonl: join results as a
// multiset (which of two matching rows arrives first decides nothing but the order), and the
// late rows (the input lines that are no join result) exactly.
func checkJoin(t *testing.T, dir string, got []string) {
	t.Helper()
	want := readLines(t, filepath.Join(dir, "expected.jsonl"))
	split := func(lines []string) (joined, late []string) {
		for _, l := range lines {
			var v map[string]json.RawMessage
			if err := json.Unmarshal([]byte(l), &v); err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			if _, ok := v["side"]; ok {
				late = append(late, l)
			} else {
				joined = append(joined, l)
			}
		}
		return sorted(joined), sorted(late)
	}
	gj, gl := split(got)
	wj, wl := split(want)
	if !slices.Equal(gl, wl) {
		t.Errorf("late rows:\n%s\nwant:\n%s", strings.Join(gl, "\n"), strings.Join(wl, "\n"))
	}
	if !slices.Equal(gj, wj) {
		for _, l := range wj {
			if !slices.Contains(gj, l) {
				t.Errorf("missing: %s", l)
			}
		}
		for _, l := range gj {
			if !slices.Contains(wj, l) {
				t.Errorf("unexpected: %s", l)
			}
		}
		t.Fatalf("%d join results, want %d", len(gj), len(wj))
	}
}

// TestExampleIntervalJoin runs the interval join example as written.
func TestExampleIntervalJoin(t *testing.T) {
	const dir = "../../examples/wasm/interval-join"
	got, _ := runExampleWith(t, dir, "file://"+t.TempDir(), nil)
	checkJoin(t, dir, got)
}

// TestExampleIntervalJoinCold runs the interval join with a hot tier far too small for its
// state, at three subtasks, with a checkpoint every few milliseconds: its buckets, indexes and
// timer states are spilled and evicted, so reads go to the durable tier and suspend, and the
// timers of a watermark fire while reads of earlier records may still be out. The output must
// not change.
func TestExampleIntervalJoinCold(t *testing.T) {
	const dir = "../../examples/wasm/interval-join"
	got, m := runExampleWith(t, dir, "file://"+t.TempDir()+"?hot_bytes=8K&fsync=false", func(s *pipeline.Spec) {
		s.Operators[0].Parallelism = 3
		d := pipeline.Duration(5 * time.Millisecond)
		s.Checkpoints.Interval = &d
	})
	t.Logf("hot tier: %d hits, %d misses, %d keys fetched, %d evictions", m.Hits, m.Misses, m.FetchKeys, m.Evictions)
	if m.Misses == 0 || m.FetchKeys == 0 {
		t.Fatalf("no read went to the durable tier (%d misses, %d keys fetched): the test tests nothing", m.Misses, m.FetchKeys)
	}
	checkJoin(t, dir, got)
}

// TestExampleEnrich runs the enrichment example against its upstream (the directory
// examples/wasm/enrich/upstream, served over loopback HTTP as the README's python3 -m
// http.server does): every order is enriched with its user's profile, or null for a user
// the upstream does not know (404), in each user's order.
func TestExampleEnrich(t *testing.T) {
	const dir = "../../examples/wasm/enrich"
	var hits atomic.Int64
	files := http.FileServer(http.Dir(filepath.Join(dir, "upstream")))
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		files.ServeHTTP(w, r)
	}))
	defer up.Close()
	got, _ := runExampleWith(t, dir, "file://"+t.TempDir(), func(s *pipeline.Spec) {
		s.Operators[0].Endpoints[0].BaseURL = up.URL
	})
	want := readLines(t, filepath.Join(dir, "expected.jsonl"))
	if !slices.Equal(sorted(got), sorted(want)) {
		t.Fatalf("got %d lines:\n%s\nwant %d", len(got), strings.Join(got, "\n"), len(want))
	}
	byUser := func(lines []string) map[string][]string {
		m := map[string][]string{}
		for _, l := range lines {
			var v struct{ User string }
			if err := json.Unmarshal([]byte(l), &v); err != nil {
				t.Fatal(err)
			}
			m[v.User] = append(m[v.User], l)
		}
		return m
	}
	g, w := byUser(got), byUser(want)
	for u := range w {
		if !slices.Equal(g[u], w[u]) {
			t.Errorf("user %s: out of order: %v", u, g[u])
		}
	}
	// Identical concurrent GETs may share one upstream call (single flight), never more
	// than one call per order.
	if n := hits.Load(); n == 0 || n > int64(len(want)) {
		t.Errorf("the upstream saw %d requests for %d orders", n, len(want))
	}
}
