package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/connector/file"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// subtaskSink counts, per sink subtask, the records it was given.
type subtaskSink struct {
	mu  sync.Mutex
	per map[int]int
}

type subtaskWriter struct {
	s       *subtaskSink
	subtask int
}

func (s *subtaskSink) Committer() pipeline.SinkCommitter { return nil }
func (s *subtaskSink) Open(_ context.Context, sc pipeline.SinkContext) (pipeline.SinkWriter, error) {
	return &subtaskWriter{s: s, subtask: sc.Subtask}, nil
}
func (w *subtaskWriter) Write(_ context.Context, recs []pipeline.SinkRecord) error {
	w.s.mu.Lock()
	w.s.per[w.subtask] += len(recs)
	w.s.mu.Unlock()
	return nil
}
func (w *subtaskWriter) PreCommit(context.Context, uint64) ([]byte, error) { return nil, nil }
func (w *subtaskWriter) Close(context.Context) error                       { return nil }

// TestChainedSinkForwards: a sink at its operator's parallelism is chained to it, so each
// operator subtask's output reaches the sink subtask of the same index even when its key
// belongs to another subtask (here every output has the key "x"); a sink of another
// parallelism still takes its records hashed by key, all in one subtask.
func TestChainedSinkForwards(t *testing.T) {
	rekey := func() pipeline.NativeOperator {
		return func(c *pipeline.NativeCall, _, value []byte, _ int64) error { return c.Emit([]byte("x"), value) }
	}
	for _, tc := range []struct {
		sinkPar int
		chained bool
	}{{2, true}, {1, false}, {3, false}} {
		t.Run(fmt.Sprint(tc.sinkPar), func(t *testing.T) {
			sink := &subtaskSink{per: map[int]int{}}
			c := connectors()
			c.RegisterSink("counting", func(*pipeline.SinkSpec, *pipeline.ConnectorOptions, *pipeline.Env) (pipeline.Sink, error) {
				return sink, nil
			})
			const total = 4000
			spec := fmt.Sprintf(`
name: fwd
sources: [{name: g, type: generator, count: %d, keys: 100, splits: 2, parallelism: 2}]
operators: [{name: rekey, module: %s, inputs: [g], key: key, parallelism: 2}]
sinks: [{name: out, type: counting, inputs: [rekey], parallelism: %d}]
`, total/2, counterWasm(t), tc.sinkPar)
			m, err := runSpec(t, spec, pipeline.Env{Connectors: c, StateURL: "mem://",
				Native: map[string]func() pipeline.NativeOperator{"rekey": rekey}})
			if err != nil {
				t.Fatal(err)
			}
			sum := 0
			for _, n := range sink.per {
				sum += n
			}
			if sum != total {
				t.Fatalf("the sink got %d of %d records: %v", sum, total, sink.per)
			}
			if tc.chained {
				// Each sink subtask has exactly what its operator subtask emitted.
				for i, op := range m.Operators {
					if int64(sink.per[i]) != op.RecordsOut || op.RecordsOut == 0 {
						t.Fatalf("sink subtask %d got %d records, operator subtask %d emitted %d", i, sink.per[i], i, op.RecordsOut)
					}
				}
				for _, s := range m.Sinks {
					if s.RecordsIn != int64(sink.per[s.Subtask]) {
						t.Fatalf("metrics: sink subtask %d reports %d records, got %d", s.Subtask, s.RecordsIn, sink.per[s.Subtask])
					}
				}
			} else if len(sink.per) != 1 {
				t.Fatalf("hashed by the key x, the records reached %d sink subtasks: %v", len(sink.per), sink.per)
			}
		})
	}
}

// failingFileSink is the file sink whose first writer to reach after records fails a write
// once: the job restarts, and the chained sink's output must still be exactly once.
type failingFileSink struct {
	pipeline.Sink
	after  int64
	n      atomic.Int64
	failed *atomic.Bool
}

type failingWriter struct {
	pipeline.SinkWriter
	s *failingFileSink
}

func (s *failingFileSink) Open(ctx context.Context, sc pipeline.SinkContext) (pipeline.SinkWriter, error) {
	w, err := s.Sink.Open(ctx, sc)
	return &failingWriter{SinkWriter: w, s: s}, err
}

func (w *failingWriter) Write(ctx context.Context, recs []pipeline.SinkRecord) error {
	if w.s.n.Add(int64(len(recs))) > w.s.after && w.s.failed.CompareAndSwap(false, true) {
		return errors.New("quota exceeded")
	}
	return w.SinkWriter.Write(ctx, recs)
}

// TestChainedSinkExactlyOnce: a chained file sink at parallelism 2 whose write fails once: the
// failure is the sink's (not the operator call's it was writing for), the job restarts from
// its last checkpoint, and the committed output equals an uninterrupted run's. Without a
// restart strategy the job fails naming the sink.
func TestChainedSinkExactlyOnce(t *testing.T) {
	dir := t.TempDir()
	var failed atomic.Bool
	c := connectors()
	c.RegisterSink("failing", func(s *pipeline.SinkSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Sink, error) {
		snk, err := file.NewSink(s, o, env)
		if err != nil {
			return nil, err
		}
		return &failingFileSink{Sink: snk, after: 3000, failed: &failed}, nil
	})
	const count = 6000
	ref := filepath.Join(dir, "ref.jsonl")
	if _, err := runSpec(t, genSpec("ref", ref, 1, count, 0), pipeline.Env{StateURL: "file://" + filepath.Join(dir, "refstate")}); err != nil {
		t.Fatal(err)
	}
	spec := func(out, restart string) string {
		return strings.Replace(genSpec("eo", out, 2, count, 20000), "{name: out, type: file,", "{name: out, type: failing, parallelism: 2,", 1) + restart
	}
	out := filepath.Join(dir, "out.jsonl")
	m, err := runSpec(t, spec(out, "restart: {strategy: fixed-delay, attempts: 2, delay: 10ms}\n"),
		pipeline.Env{Connectors: c, StateURL: "file://" + filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	if !failed.Load() || m.Restarts != 1 {
		t.Fatalf("failed %v, metrics %+v", failed.Load(), m)
	}
	comparePerKey(t, readLines(t, out), readLines(t, ref))

	failed.Store(false)
	_, err = runSpec(t, spec(filepath.Join(dir, "out2.jsonl"), ""), pipeline.Env{Connectors: c, StateURL: "file://" + filepath.Join(dir, "state2")})
	if err == nil || !strings.HasPrefix(err.Error(), "sink out[") || !strings.Contains(err.Error(), "quota exceeded") {
		t.Fatalf("want the sink's failure, got %v", err)
	}
}

// TestChainedSinkRescale: 2 -> 3 -> 1 subtasks across savepoints with the file sink chained
// to the operator at each parallelism: the output equals an unrescaled, uninterrupted run.
func TestChainedSinkRescale(t *testing.T) {
	dir := t.TempDir()
	const count = 6000
	ref := filepath.Join(dir, "ref.jsonl")
	if _, err := runSpec(t, genSpec("ref", ref, 1, count, 0), pipeline.Env{StateURL: "file://" + filepath.Join(dir, "refstate")}); err != nil {
		t.Fatal(err)
	}
	spec := func(par int, rate float64) string {
		return strings.Replace(genSpec("job", filepath.Join(dir, "out.jsonl"), par, count, rate),
			"{name: out, type: file,", fmt.Sprintf("{name: out, type: file, parallelism: %d,", par), 1)
	}
	env := pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")}
	var last uint64
	for i, par := range []int{2, 3} {
		if i > 0 {
			env.Restore = "latest"
		}
		j := start(t, spec(par, 500), env) // headroom on a loaded machine, as in TestRescaleAcrossSavepoints
		waitOutput(t, j, int64(1000*(i+1)))
		id, err := j.Stop(context.Background(), true)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := j.Wait(); err != nil || m.LastCheckpoint == nil || m.LastCheckpoint.ID != id || len(m.Sinks) != par {
			t.Fatalf("stop at parallelism %d: %v %+v", par, err, m)
		}
		last = id
	}
	env.Restore = "latest"
	m, err := runSpec(t, spec(1, 0), env)
	if err != nil || m.Restored != last {
		t.Fatalf("%v %+v (restored %d, want %d)", err, m, m.Restored, last)
	}
	comparePerKey(t, readLines(t, filepath.Join(dir, "out.jsonl")), readLines(t, ref))
}

// TestChainedSinkBackpressure: a chained sink that stops taking records blocks its operator's
// runner, so the channels into the operator fill and the source stops; released, the job
// delivers every record.
func TestChainedSinkBackpressure(t *testing.T) {
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
sinks: [{name: out, type: blocking, inputs: [count], parallelism: 2}]
`, total, counterWasm(t))
	j := start(t, spec, pipeline.Env{Connectors: c, StateURL: "mem://", StuckAfter: 20 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	stuck := func() bool {
		return slices.ContainsFunc(strings.Split(logs.String(), "\n"), func(l string) bool {
			return strings.Contains(l, "channel stuck") && strings.Contains(l, "from=g[0]") && strings.Contains(l, "to=count[")
		})
	}
	for range 2000 {
		if stuck() {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !stuck() {
		t.Fatalf("no stuck-channel log naming g -> count:\n%s", logs.String())
	}
	var read int64
	for range 50 {
		now := j.Metrics().Sources[0].RecordsIn
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
	if strings.Contains(logs.String(), "to=out[") {
		t.Fatalf("a channel into the chained sink:\n%s", logs.String())
	}
	close(sink.release)
	if _, err := j.Wait(); err != nil {
		t.Fatal(err)
	}
	if sink.n != total {
		t.Fatalf("the sink got %d of %d records", sink.n, total)
	}
}
