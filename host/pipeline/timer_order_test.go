package pipeline_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/connector/file"
	"github.com/clink-wasm/clink-wasm/host/connector/stdout"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// Watermark and timer order when state reads go to the durable tier.
//
// The tumbling example counts records per key and one-minute window and emits a window's
// count from an event-time timer. Its output is exact only if every timer fires after every
// record before the watermark that releases it has been processed: a timer that overtook a
// record still suspended on a cold read would emit a short count, and the record would then
// register the timer again and emit a second line for the window. Timers of a key must also
// fire in time order. The hot tier here is far too small for the state, so most reads are
// cold and suspend, and they complete in a different order than they were issued.

// windowWorkload writes n records of keys keys, in event-time order but out of order by up
// to 3 s (the spec allows 5 s, so none is late), and returns the expected window lines, in
// each key's window order.
func windowWorkload(t *testing.T, path string, n, keys int, seed uint64) map[string][]string {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	type rec struct {
		key string
		ts  int64
	}
	recs := make([]rec, n)
	ts := int64(-90_000) // windows before the epoch too
	for i := range recs {
		ts += int64(rng.IntN(60))
		recs[i] = rec{fmt.Sprintf("u%d", rng.IntN(keys)), ts}
	}
	for i := 0; i+1 < n; i++ {
		if rng.IntN(3) == 0 && recs[i+1].ts-recs[i].ts <= 3000 {
			recs[i], recs[i+1] = recs[i+1], recs[i]
		}
	}
	var b strings.Builder
	counts := map[string]map[int64]int{}
	for _, r := range recs {
		fmt.Fprintf(&b, `{"user":%q,"ts":%d}`+"\n", r.key, r.ts)
		w := r.ts / 60_000 * 60_000
		if r.ts%60_000 < 0 {
			w -= 60_000
		}
		if counts[r.key] == nil {
			counts[r.key] = map[int64]int{}
		}
		counts[r.key][w]++
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	for k, ws := range counts {
		starts := make([]int64, 0, len(ws))
		for w := range ws {
			starts = append(starts, w)
		}
		slices.Sort(starts)
		for _, w := range starts {
			want[k] = append(want[k], fmt.Sprintf(`{"key":%q,"window_start":%d,"count":%d}`, k, w, ws[w]))
		}
	}
	return want
}

// runWindows runs the tumbling module over input at parallelism 2 with its state in store
// (checkpoint records under recordsURL) and returns its output lines.
func runWindows(t *testing.T, input string, store *state.Store, recordsURL string) []string {
	t.Helper()
	spec, err := pipeline.ParseSpec([]byte(fmt.Sprintf(`
name: timer-order
checkpoints: {interval: 5ms}
sources:
  - {name: in, type: file, path: %s, event_time: {field: ts, max_out_of_orderness: 5s, watermark_every: 20}}
operators:
  - {name: windows, module: %s, inputs: [in], key: user, parallelism: 2}
sinks:
  - {name: out, type: stdout, inputs: [windows]}
`, input, must(filepath.Abs("../../examples/wasm/tumbling/tumbling-as.wasm")))))
	if err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	c := &pipeline.Connectors{}
	file.Register(c)
	stdout.Register(c, &out)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	j, err := pipeline.Start(ctx, spec, pipeline.Env{Connectors: c, Store: store, StateURL: recordsURL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Wait(); err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(out.b.String(), "\n"), "\n")
}

func checkWindows(t *testing.T, got []string, want map[string][]string, m state.Metrics) {
	t.Helper()
	t.Logf("%d windows; hot tier: %d hits, %d misses, %d keys fetched, %d evictions, %d remote GETs (mean %v)",
		len(got), m.Hits, m.Misses, m.FetchKeys, m.Evictions, m.RemoteGets, m.RemoteGetLatency)
	if m.Misses < 100 || m.FetchKeys < 100 {
		t.Fatalf("only %d misses, %d keys fetched: the reads did not go to the durable tier", m.Misses, m.FetchKeys)
	}
	g := byJSONKey(t, got)
	n := 0
	for k, w := range want {
		n += len(w)
		if !slices.Equal(g[k], w) {
			t.Fatalf("key %s: windows\n%s\nwant\n%s", k, strings.Join(g[k], "\n"), strings.Join(w, "\n"))
		}
	}
	if len(got) != n {
		t.Fatalf("%d windows, want %d", len(got), n)
	}
}

// TestTimerOrderColdFile: the durable tier is file://, behind an 8 KiB hot tier with a
// checkpoint every 5 ms (so dirty state becomes evictable).
func TestTimerOrderColdFile(t *testing.T) {
	dir := t.TempDir()
	input := filepath.Join(dir, "in.jsonl")
	want := windowWorkload(t, input, 6000, 400, 1)
	u := "file://" + filepath.Join(dir, "state")
	store, err := state.Open(context.Background(), u+"?hot_bytes=8K&fsync=false")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	got := runWindows(t, input, store, u)
	checkWindows(t, got, want, store.Metrics())
}

// TestTimerOrderColdS3: the durable tier is S3 (versitygw on loopback) behind a proxy that
// delays each response by a random 0-4 ms, so cold reads complete out of order. It needs
// the server (scripts/with-s3.sh, which make test uses) and fails without it under CI=true.
func TestTimerOrderColdS3(t *testing.T) {
	ep := os.Getenv("CLINK_TEST_S3_ENDPOINT")
	if ep == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CLINK_TEST_S3_ENDPOINT is not set: run under scripts/with-s3.sh")
		}
		t.Skip("needs the loopback S3 server: scripts/with-s3.sh")
	}
	bucket := os.Getenv("CLINK_TEST_S3_BUCKET")
	if bucket == "" {
		bucket = "clink-test"
	}
	dir := t.TempDir()
	input := filepath.Join(dir, "in.jsonl")
	want := windowWorkload(t, input, 4000, 300, 2)
	proxy := randomLatencyProxy(t, ep, 4*time.Millisecond, 3)
	s3URL := fmt.Sprintf("s3://%s/timer-order/%d?endpoint=%s&path_style=true&hot_bytes=8K", bucket, time.Now().UnixNano(), url.QueryEscape(proxy))
	store, err := state.Open(context.Background(), s3URL)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	got := runWindows(t, input, store, "file://"+filepath.Join(dir, "records"))
	checkWindows(t, got, want, store.Metrics())
}

// randomLatencyProxy forwards to endpoint, delaying each response by a random duration in
// [0, maxLat) drawn from a seeded generator.
func randomLatencyProxy(t *testing.T, endpoint string, maxLat time.Duration, seed uint64) string {
	t.Helper()
	target, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 256}
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 11))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		d := time.Duration(rng.Int64N(int64(maxLat)))
		mu.Unlock()
		tm := time.NewTimer(d)
		select {
		case <-tm.C:
		case <-r.Context().Done():
			tm.Stop()
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}
