package pipeline_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// TestGuestKeyAndChain: records keyed by the guest's clink_key are hashed onto 3 subtasks; a
// chained operator downstream keeps the key (no re-keying).
func TestGuestKeyAndChain(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	var b strings.Builder
	for i := range 300 {
		fmt.Fprintf(&b, "{\"%c\":%d}\n", 'a'+i%26, i)
	}
	os.WriteFile(in, []byte(b.String()), 0o644)
	out := filepath.Join(dir, "out.jsonl")
	spec := fmt.Sprintf(`
name: keys
sources: [{name: in, type: file, path: %s}]
operators:
  - {name: k, module: %s, inputs: [in], key: {guest: true}, parallelism: 3}
  - {name: count, module: %s, inputs: [k], chain: true, parallelism: 3}
sinks: [{name: out, type: file, path: %s, inputs: [count]}]
`, in, must(filepath.Abs("../abi/testdata/keyfn.wasm")), counterWasm(t), out)
	if _, err := runSpec(t, spec, pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")}); err != nil {
		t.Fatal(err)
	}
	// keyfn keys by the first 3 bytes of the value, `{"a` to `{"z`: 26 keys over 3 subtasks,
	// each key's counts 1..n in order.
	got := readLines(t, out)
	if len(got) != 300 {
		t.Fatalf("%d outputs", len(got))
	}
	byKey := perKey(t, got)
	if len(byKey) != 26 {
		t.Fatalf("%d keys", len(byKey))
	}
	for k, ls := range byKey {
		for i, l := range ls {
			if w := fmt.Sprintf(`{"key":%q,"count":%d}`, k, i+1); l != w {
				t.Fatalf("key %s line %d: %s, want %s", k, i, l, w)
			}
		}
	}
	m, _ := runSpec(t, spec, pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state2")})
	busy := 0
	for _, o := range m.Operators {
		if o.Node == "k" && o.RecordsIn > 0 {
			busy++
		}
	}
	if busy < 2 {
		t.Fatalf("the guest key did not spread records over subtasks: %+v", m.Operators)
	}
}

// blockingSink holds every write until released, to test backpressure.
type blockingSink struct {
	release chan struct{}
	mu      sync.Mutex
	n       int
}

func (s *blockingSink) Committer() pipeline.SinkCommitter { return nil }
func (s *blockingSink) Open(context.Context, pipeline.SinkContext) (pipeline.SinkWriter, error) {
	return s, nil
}
func (s *blockingSink) Write(ctx context.Context, recs []pipeline.SinkRecord) error {
	select {
	case <-s.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.mu.Lock()
	s.n += len(recs)
	s.mu.Unlock()
	return nil
}
func (s *blockingSink) PreCommit(context.Context, uint64) ([]byte, error) { return nil, nil }
func (s *blockingSink) Close(context.Context) error                       { return nil }

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestBackpressure: a sink that stops taking records stops the source (bounded channels,
// nothing dropped), the stuck channel is logged, and the input-depth gauges show where records
// wait. Released, the job delivers every record.
func TestBackpressure(t *testing.T) {
	sink := &blockingSink{release: make(chan struct{})}
	c := connectors()
	c.RegisterSink("blocking", func(*pipeline.SinkSpec, *pipeline.ConnectorOptions, *pipeline.Env) (pipeline.Sink, error) {
		return sink, nil
	})
	var logs syncBuffer
	const total = 60000
	spec := fmt.Sprintf(`
name: bp
checkpoints: {interval: 0s}
sources: [{name: g, type: generator, count: %d, keys: 50}]
operators: [{name: count, module: %s, inputs: [g], key: key, parallelism: 2}]
sinks: [{name: out, type: blocking, inputs: [count]}]
`, total, counterWasm(t))
	j := start(t, spec, pipeline.Env{Connectors: c, StateURL: "mem://", StuckAfter: 20 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	var read int64
	// Wait (bounded) for the log of the channel into the blocked sink itself: under load the
	// source's channel into count can be reported first, and the one into out only later.
	stuckOut := func() bool {
		return slices.ContainsFunc(strings.Split(logs.String(), "\n"), func(l string) bool {
			return strings.Contains(l, "channel stuck") && strings.Contains(l, "from=count[") && strings.Contains(l, "to=out[0]")
		})
	}
	for range 2000 {
		if stuckOut() {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !stuckOut() {
		t.Fatalf("no stuck-channel log naming count -> out:\n%s", logs.String())
	}
	// Let the pipeline settle: everything that can move has moved once the source's count
	// stops changing while the sink is blocked.
	for range 50 {
		m := j.Metrics()
		now := m.Sources[0].RecordsIn
		if now == read && now > 0 {
			break
		}
		read = now
		time.Sleep(20 * time.Millisecond)
	}
	m := j.Metrics()
	if m.Sources[0].RecordsIn >= total/2 {
		t.Fatalf("the source read %d of %d records while the sink was blocked: no backpressure", m.Sources[0].RecordsIn, total)
	}
	depth := 0
	for _, o := range append(m.Operators, m.Sinks...) {
		depth += o.InputDepth
	}
	if depth == 0 {
		t.Fatalf("no input depth reported: %+v", m)
	}
	close(sink.release)
	m, err := j.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if sink.n != total {
		t.Fatalf("the sink got %d of %d records", sink.n, total)
	}
}

// TestTenantNamespacing: a tenant's checkpoint records and state live under its own prefixes,
// and two tenants running the same job name do not see each other's checkpoints.
func TestTenantNamespacing(t *testing.T) {
	dir := t.TempDir()
	env := pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")}
	for _, tenant := range []string{"acme", "globex"} {
		out := filepath.Join(dir, tenant+".jsonl")
		spec := fmt.Sprintf("tenant: %s\n%s", tenant, genSpec("shared", out, 2, 500, 0))
		m, err := runSpec(t, spec, env)
		if err != nil || m.Restored != 0 {
			t.Fatalf("%s: %v, restored %d", tenant, err, m.Restored)
		}
		for _, p := range []string{"jobs/" + tenant + "/shared/checkpoints", "tenants/" + tenant + "/operators/shared.count"} {
			if _, err := os.Stat(filepath.Join(dir, "state", p)); err != nil {
				t.Fatalf("%s: %v", tenant, err)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "operators")); err == nil {
		t.Fatal("tenant state written outside tenants/")
	}
}

// TestStreamingMode: in streaming mode a job whose bounded sources ended keeps running (and
// checkpointing) until stopped; a stop with a savepoint then ends it. In the default mode the
// same job ends by itself with a final savepoint.
func TestStreamingMode(t *testing.T) {
	dir := t.TempDir()
	spec := "mode: streaming\n" + genSpec("stream", filepath.Join(dir, "out.jsonl"), 1, 300, 0)
	j := start(t, spec, pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")})
	waitOutput(t, j, 300)
	first := uint64(0)
	for range 400 { // periodic checkpoints go on after the end of the input
		if c := j.Metrics().LastCheckpoint; c != nil {
			if first == 0 {
				first = c.ID
			} else if c.ID > first {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case <-j.Done():
		t.Fatal("a streaming job ended by itself")
	default:
	}
	id, err := j.Stop(context.Background(), true)
	if err != nil || id <= first {
		t.Fatalf("stop: %d %v", id, err)
	}
	m, err := j.Wait()
	if err != nil || m.State != pipeline.JobStopped || !m.LastCheckpoint.Savepoint || !m.LastCheckpoint.Final {
		t.Fatalf("%v %+v", err, m.LastCheckpoint)
	}

	m, err = runSpec(t, genSpec("bounded", filepath.Join(dir, "b.jsonl"), 1, 300, 0), pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")})
	if err != nil || m.State != pipeline.JobFinished || !m.LastCheckpoint.Savepoint || !m.LastCheckpoint.Final {
		t.Fatalf("bounded: %v %+v", err, m.LastCheckpoint)
	}
	// mode: bounded refuses a source that never ends, naming it.
	s, _ := pipeline.ParseSpec([]byte("mode: bounded\n" + genSpec("nb", filepath.Join(dir, "c.jsonl"), 1, 0, 10)))
	if _, err := pipeline.Start(context.Background(), s, pipeline.Env{Connectors: connectors(), StateURL: "mem://"}); err == nil ||
		!strings.Contains(err.Error(), "sources[0]: mode is bounded but this source never ends") {
		t.Fatalf("want a bounded-mode error, got %v", err)
	}
}
