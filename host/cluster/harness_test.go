package cluster

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/cluster/clustertest"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// cluster is a kfake cluster with an input topic, and the shared state pool of the workers.
type testCluster struct {
	t       testing.TB
	brokers []string
	parts   int32
	state   string // base state URL
	counter string // counter module path

	mu     sync.Mutex
	events []Event
	outs   []collected // the collect sink's records (at least once)
}

type collected struct {
	task, key, value string
}

func newTestCluster(t testing.TB, parts int32, stateURL string) *testCluster {
	t.Helper()
	brokers := clustertest.Kafka(t, parts)
	wasm, err := filepath.Abs("../../examples/wasm/counter/counter-as.wasm")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(wasm); err != nil {
		t.Fatal(err)
	}
	if stateURL == "" {
		stateURL, err = pipeline.StateURLForDir(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
	}
	return &testCluster{t: t, brokers: brokers, parts: parts, state: stateURL, counter: wasm}
}

func (c *testCluster) produce(from, n, keys int) map[string]int {
	return clustertest.Produce(c.t, c.brokers, from, n, keys)
}

func (c *testCluster) spec(sink string) *pipeline.Spec {
	c.t.Helper()
	brokers, _ := json.Marshal(c.brokers)
	sinkBlock := `{"name": "out", "type": "collect", "inputs": ["count"]}`
	if sink == "kafka" {
		sinkBlock = `{"name": "out", "type": "kafka", "inputs": ["count"], "options": {"brokers": ` + string(brokers) + `, "topic": "out"}}`
	}
	js := `{"version": 1, "name": "cnt", "key_groups": 8,
	  "checkpoints": {"interval": "100ms"},
	  "sources": [{"name": "in", "type": "kafka", "options": {"brokers": ` + string(brokers) + `, "topics": ["in"], "start_from": "earliest"}}],
	  "operators": [{"name": "count", "module": "` + c.counter + `", "inputs": ["in"], "key": {"source": true}}],
	  "sinks": [` + sinkBlock + `]}`
	spec, err := pipeline.ParseSpec([]byte(js))
	if err != nil {
		c.t.Fatal(err)
	}
	return spec
}

var waitLimit = 90 * time.Second

func (c *testCluster) onEvent(e Event) {
	if testing.Verbose() {
		c.t.Logf("event %+v", e)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, e)
}

func (c *testCluster) eventsOf(kind EventKind) []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Event
	for _, e := range c.events {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// worker is one in-process worker and its Run's result.
type testWorker struct {
	w      *Worker
	cancel context.CancelFunc
	done   chan error
}

func (c *testCluster) startWorker(spec *pipeline.Spec, opts ...func(*Options)) *testWorker {
	c.t.Helper()
	o := Options{
		Spec: spec, StateURL: c.state, NewConnectors: c.connectors,
		SessionTimeout: 1500 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond,
		RebalanceTimeout: 30 * time.Second, RestartDelay: 300 * time.Millisecond,
		OnEvent: c.onEvent,
	}
	for _, f := range opts {
		f(&o)
	}
	w, err := New(o)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tw := &testWorker{w: w, cancel: cancel, done: make(chan error, 1)}
	go func() { tw.done <- w.Run(ctx) }()
	c.t.Cleanup(func() { tw.stop(c.t) })
	return tw
}

// stop leaves the group gracefully (final checkpoints) and waits for Run.
func (tw *testWorker) stop(t testing.TB) {
	if tw.cancel == nil {
		return
	}
	tw.cancel()
	tw.cancel = nil
	select {
	case err := <-tw.done:
		if err != nil {
			t.Errorf("worker: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Error("worker did not stop")
	}
}

// waitFor polls cond (bounded): the group's progress has no event to wait on from outside.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	waitForUpTo(t, waitLimit, what, cond)
}

// waitForUpTo is waitFor with its own bound (benchmarks preloading millions of records).
func waitForUpTo(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// partitioned reports whether the workers own every partition exactly once.
func (c *testCluster) partitioned(ws ...*testWorker) bool {
	seen := map[int32]int{}
	for _, w := range ws {
		for _, p := range w.w.Owned() {
			seen[p]++
		}
	}
	if len(seen) != int(c.parts) {
		return false
	}
	for _, n := range seen {
		if n != 1 {
			return false
		}
	}
	return true
}
