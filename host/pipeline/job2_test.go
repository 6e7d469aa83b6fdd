package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/connector/file"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
)

func start(t *testing.T, yaml string, env pipeline.Env) *pipeline.Job {
	t.Helper()
	spec, err := pipeline.ParseSpec([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	if env.Connectors == nil {
		env.Connectors = connectors()
	}
	j, err := pipeline.Start(context.Background(), spec, env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Stop(context.Background(), false) })
	return j
}

// waitOutput waits until the job's sinks have received at least n records.
func waitOutput(t *testing.T, j *pipeline.Job, n int64) {
	t.Helper()
	for range 2000 {
		var got int64
		for _, s := range j.Metrics().Sinks {
			got += s.RecordsIn
		}
		if got >= n {
			return
		}
		select {
		case <-j.Done():
			m, err := j.Wait()
			t.Fatalf("the job ended early: %v %+v", err, m)
		case <-time.After(5 * time.Millisecond):
		}
	}
	t.Fatalf("no %d outputs", n)
}

func genSpec(name, out string, par, count int, rate float64) string {
	return fmt.Sprintf(`
name: %s
checkpoints: {interval: 50ms}
sources:
  - {name: gen, type: generator, kind: counter, seed: 7, splits: 3, count: %d, rate: %v, keys: 200}
operators:
  - {name: count, module: %s, inputs: [gen], key: key, parallelism: %d}
sinks:
  - {name: out, type: file, path: %s, inputs: [count]}
`, name, count, rate, must(filepath.Abs("../../examples/wasm/counter/counter-as.wasm")), par, out)
}

func comparePerKey(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d", len(got), len(want))
	}
	gk, wk := perKey(t, got), perKey(t, want)
	for k, w := range wk {
		if !slices.Equal(gk[k], w) {
			t.Fatalf("key %q: %d lines, want %d", k, len(gk[k]), len(w))
		}
	}
}

// TestRescaleAcrossSavepoints: 2 -> 3 -> 1 subtasks across stop-with-savepoint, then the job
// runs to its end; the output equals an unrescaled, uninterrupted run. The rate (500 a second
// per split, 12 s of input) leaves each stage seconds of headroom on a loaded CI machine: at 4000
// a second a slow stop once let the first stage consume nearly all the input.
func TestRescaleAcrossSavepoints(t *testing.T) {
	dir := t.TempDir()
	const count = 6000
	ref := filepath.Join(dir, "ref.jsonl")
	if _, err := runSpec(t, genSpec("ref", ref, 1, count, 0), pipeline.Env{StateURL: "file://" + filepath.Join(dir, "refstate")}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.jsonl")
	env := pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")}
	var ids []uint64
	for i, par := range []int{2, 3} {
		if i > 0 {
			env.Restore = "latest"
		}
		j := start(t, genSpec("job", out, par, count, 500), env)
		waitOutput(t, j, int64(1000))
		id, err := j.Stop(context.Background(), true)
		if err != nil {
			t.Fatal(err)
		}
		m, err := j.Wait()
		if err != nil || m.State != pipeline.JobStopped || m.LastCheckpoint == nil || !m.LastCheckpoint.Savepoint || m.LastCheckpoint.ID != id {
			t.Fatalf("stop: %v %+v", err, m)
		}
		ids = append(ids, id)
	}
	env.Restore = "latest"
	m, err := runSpec(t, genSpec("job", out, 1, count, 0), env)
	if err != nil || m.Restored != ids[1] {
		t.Fatalf("%v %+v (restored %d, want %d)", err, m, m.Restored, ids[1])
	}
	comparePerKey(t, readLines(t, out), readLines(t, ref))
}

// TestSavepointOnDemand takes savepoints while the job runs; each is a committed record
// that is a savepoint, and the job goes on.
func TestSavepointOnDemand(t *testing.T) {
	dir := t.TempDir()
	j := start(t, genSpec("sp", filepath.Join(dir, "out.jsonl"), 2, 0, 3000), pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")})
	waitOutput(t, j, 100)
	var last uint64
	for range 3 {
		id, err := j.Savepoint(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if id <= last {
			t.Fatalf("savepoint %d after %d", id, last)
		}
		last = id
		b, err := os.ReadFile(filepath.Join(dir, "state", "jobs", "_", "sp", "checkpoints", fmt.Sprintf("%020d.json", id)))
		if err != nil || !strings.Contains(string(b), `"savepoint": true`) {
			t.Fatalf("savepoint record %d: %v %s", id, err, b)
		}
	}
	if _, err := j.Stop(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if m, _ := j.Wait(); m.State != pipeline.JobStopped {
		t.Fatalf("state %s", m.State)
	}
	if _, err := j.Savepoint(context.Background()); !errors.Is(err, pipeline.ErrNotRunning) {
		t.Fatalf("savepoint of a stopped job: %v", err)
	}
	// Savepoints survive retention (retain 3, and at least 3 periodic checkpoints ran).
	ents, _ := os.ReadDir(filepath.Join(dir, "state", "jobs", "_", "sp", "checkpoints"))
	if len(ents) < 3 {
		t.Fatalf("%d records kept", len(ents))
	}
}

// flakySource fails its first attempt's reader after some records.
type flakySource struct {
	pipeline.Source
	failed *atomic.Bool
}

func (f *flakySource) Open(ctx context.Context, s []pipeline.Split) (pipeline.SourceReader, error) {
	r, err := f.Source.Open(ctx, s)
	return &flakyReader{SourceReader: r, failed: f.failed}, err
}

type flakyReader struct {
	pipeline.SourceReader
	failed *atomic.Bool
	n      int
}

func (r *flakyReader) Read(ctx context.Context, buf []pipeline.SourceRecord) (int, error) {
	if r.n > 60 && r.failed.CompareAndSwap(false, true) {
		return 0, errors.New("disk on fire")
	}
	n, err := r.SourceReader.Read(ctx, buf[:min(len(buf), 2)])
	r.n += n
	if n > 0 {
		time.Sleep(time.Millisecond) // let checkpoints happen before the failure
	}
	return n, err
}

// TestRestartStrategy: a failure restarts the job in process from its last checkpoint, and the
// output is still exactly once.
func TestRestartStrategy(t *testing.T) {
	dir := t.TempDir()
	c := connectors()
	var failed atomic.Bool
	c.RegisterSource("flaky", func(s *pipeline.SourceSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Source, error) {
		src, err := file.NewSource(s, o, env)
		if src == nil || err != nil {
			return src, err
		}
		return &flakySource{Source: src, failed: &failed}, nil
	})
	out := filepath.Join(dir, "out.jsonl")
	spec := fmt.Sprintf(`
name: flaky
checkpoints: {interval: 10ms}
restart: {strategy: fixed-delay, attempts: 2, delay: 10ms}
sources: [{name: in, type: flaky, path: %s}]
operators: [{name: count, module: %s, inputs: [in], key: user, parallelism: 2}]
sinks: [{name: out, type: file, path: %s, inputs: [count]}]
`, must(filepath.Abs("../../examples/wasm/counter/input.jsonl")), counterWasm(t), out)
	m, err := runSpec(t, spec, pipeline.Env{Connectors: c, StateURL: "file://" + filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	if !failed.Load() || m.Restarts != 1 || m.Attempts != 2 {
		t.Fatalf("failed %v, metrics %+v", failed.Load(), m)
	}
	comparePerKey(t, readLines(t, out), readLines(t, "../../examples/wasm/counter/expected.jsonl"))

	// Without a restart strategy the same failure fails the job, naming the source.
	failed.Store(false)
	spec = strings.Replace(spec, "restart: {strategy: fixed-delay, attempts: 2, delay: 10ms}", "", 1)
	if _, err := runSpec(t, spec, pipeline.Env{Connectors: c, StateURL: "file://" + filepath.Join(dir, "state2")}); err == nil ||
		!strings.Contains(err.Error(), "source in[0]: disk on fire") {
		t.Fatalf("want the source's failure, got %v", err)
	}
}

// TestOperatorFault: a guest trap fails the job with the operator, the key and the record.
func TestOperatorFault(t *testing.T) {
	dir := t.TempDir()
	spec := fmt.Sprintf(`
name: trap
sources: [{name: in, type: file, path: %s}]
operators: [{name: t, module: %s, inputs: [in], key: user, parallelism: 2}]
sinks: [{name: out, type: file, path: %s, inputs: [t]}]
`, must(filepath.Abs("../../examples/wasm/counter/input.jsonl")), must(filepath.Abs("../abi/testdata/trap.wasm")), filepath.Join(dir, "out.jsonl"))
	m, err := runSpec(t, spec, pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")})
	var oe *scheduler.OperatorError
	if !errors.As(err, &oe) {
		t.Fatalf("want an OperatorError, got %v", err)
	}
	for _, want := range []string{`operator "trapper"`, "source position", "(key ", "negative amount"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if m.State != pipeline.JobFailed {
		t.Fatalf("state %s", m.State)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "out.jsonl")); len(b) != 0 {
		t.Fatalf("a failed job committed output: %q", b)
	}
}

// TestLateRecords: with event time, a record at or before the watermark an operator has seen
// goes to its late side output.
func TestLateRecords(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	os.WriteFile(in, []byte(`{"user":"a","ts":1000}
{"user":"b","ts":2000}
{"user":"a","ts":3000}
{"user":"b","ts":1500}
{"user":"a","ts":4000}
`), 0o644)
	spec := fmt.Sprintf(`
name: late
sources:
  - {name: in, type: file, path: %s, event_time: {field: ts, watermark_every: 1}}
operators:
  - {name: count, module: %s, inputs: [in], key: user, late: side-output}
sinks:
  - {name: out, type: file, path: %s, inputs: [count]}
  - {name: late, type: file, path: %s, inputs: [count.late]}
`, in, counterWasm(t), filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "late.jsonl"))
	m, err := runSpec(t, spec, pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	if got := readLines(t, filepath.Join(dir, "late.jsonl")); !slices.Equal(got, []string{`{"user":"b","ts":1500}`}) {
		t.Fatalf("late output %q", got)
	}
	if got := readLines(t, filepath.Join(dir, "out.jsonl")); len(got) != 4 {
		t.Fatalf("main output %q", got)
	}
	if len(m.Operators) != 1 || m.Operators[0].Late != 1 || m.Operators[0].RecordsIn != 4 {
		t.Fatalf("final operator metrics: %+v", m.Operators)
	}
}
