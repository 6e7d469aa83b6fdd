package pipeline_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// Issue 12's pipeline figures, each a ratio or a distribution measured in one process:
//
//   - BenchmarkPipelineNative: generator -> keyed counter -> discard, with the AssemblyScript
//     counter and with a native Go counter doing the same work (Env.Native: the same subtasks,
//     channels, routing, state backend and checkpoints), at parallelism 1 and 2. It reports
//     x-native-pN (Wasm ÷ native throughput, target >= 0.5) and scaling (parallelism 2 ÷ 1,
//     target >= 1.6), the four runs interleaved so that load drifts hit them alike.
//   - BenchmarkCheckpointPause: the runner's share of a checkpoint at 1M keys, 10% dirty.
//   - BenchmarkPipelineLatency: end-to-end latency at half the maximum throughput.

func counterSpec(par, count int, wasm string) string {
	return fmt.Sprintf(`
name: bench
checkpoints: {interval: 1s}
sources: [{name: g, type: generator, splits: %d, count: %d, keys: 100000, parallelism: %d}]
operators: [{name: count, module: %s, inputs: [g], key: key, parallelism: %d}]
sinks: [{name: out, type: discard, inputs: [count], parallelism: %d}]
`, par, max(count/par, 1), par, wasm, par, par)
}

// nativeCounter is the counter example in Go: get the key's count, add one, put it back,
// emit {"key":K,"count":N}.
func nativeCounter() pipeline.NativeOperator {
	var out []byte
	var cell [8]byte
	return func(c *pipeline.NativeCall, key, value []byte, ts int64) error {
		v, found, err := c.Get(0, nil)
		if err != nil {
			return err
		}
		var n int64
		if found && len(v) == 8 {
			n = int64(binary.LittleEndian.Uint64(v))
		}
		n++
		binary.LittleEndian.PutUint64(cell[:], uint64(n))
		c.Put(0, nil, cell[:])
		out = append(out[:0], `{"key":`...)
		out = strconv.AppendQuote(out, string(key))
		out = append(out, `,"count":`...)
		out = strconv.AppendInt(out, n, 10)
		out = append(out, '}')
		return c.Emit(key, out)
	}
}

// runRate runs spec and returns records/s (source records over the job's wall time).
func runRate(b *testing.B, spec string, env pipeline.Env) float64 {
	b.Helper()
	start := time.Now()
	m, err := runSpec(b, spec, env)
	if err != nil {
		b.Fatal(err)
	}
	el := time.Since(start)
	var in int64
	for _, s := range m.Sources {
		in += s.RecordsIn
	}
	return float64(in) / el.Seconds()
}

func BenchmarkPipelineNative(b *testing.B) {
	wasm := counterWasm(b)
	n := b.N
	rate := map[string]float64{}
	for _, par := range []int{1, 2} {
		for _, kind := range []string{"wasm", "native"} {
			env := pipeline.Env{StateURL: "mem://"}
			if kind == "native" {
				env.Native = map[string]func() pipeline.NativeOperator{"count": nativeCounter}
			}
			rate[fmt.Sprintf("%s-p%d", kind, par)] = runRate(b, counterSpec(par, n, wasm), env)
		}
	}
	for k, v := range rate {
		b.ReportMetric(v, k+"-rec/s")
	}
	b.ReportMetric(rate["wasm-p1"]/rate["native-p1"], "x-native-p1")
	b.ReportMetric(rate["wasm-p2"]/rate["native-p2"], "x-native-p2")
	b.ReportMetric(rate["wasm-p2"]/rate["wasm-p1"], "scaling")
	b.ReportMetric(rate["native-p2"]/rate["native-p1"], "native-scaling")
}

// BenchmarkCheckpointPause: a subtask's state with 1M keys (8-byte counts), checkpointed
// once, then 10% of the keys written and checkpointed again, five times. The pause on the
// runner is Capture (a point-in-time cut of the dirty entries; the scheduler also marshals
// its timers there); Persist runs on the subtask's persister, off the runner. It reports the
// median and the largest capture, and the median persist.
func BenchmarkCheckpointPause(b *testing.B) {
	const keys, dirty, rounds = 1_000_000, 100_000, 5
	ctx := context.Background()
	for b.Loop() {
		store, err := state.Open(ctx, "file://"+b.TempDir()+"?fsync=false")
		if err != nil {
			b.Fatal(err)
		}
		be, err := store.Operator(ctx, state.OperatorOptions{Name: "pause"})
		if err != nil {
			b.Fatal(err)
		}
		if err := be.Open([]string{"count"}); err != nil {
			b.Fatal(err)
		}
		var cell [8]byte
		kb := make([]byte, 0, 16)
		put := func(i int) {
			kb = strconv.AppendInt(append(kb[:0], 'k'), int64(i), 10)
			binary.LittleEndian.PutUint64(cell[:], uint64(i))
			be.Put(state.Key{State: 0, Record: kb}, cell[:])
		}
		for i := range keys {
			put(i)
		}
		snap, err := be.Capture(1)
		if err != nil {
			b.Fatal(err)
		}
		if err := snap.Persist(ctx); err != nil {
			b.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		var caps, pers []time.Duration
		for r := range rounds {
			for range dirty {
				put(rng.IntN(keys))
			}
			t0 := time.Now()
			snap, err := be.Capture(uint64(r + 2))
			caps = append(caps, time.Since(t0))
			if err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := snap.Persist(ctx); err != nil {
				b.Fatal(err)
			}
			pers = append(pers, time.Since(t1))
		}
		be.Close()
		store.Close()
		slices.Sort(caps)
		slices.Sort(pers)
		b.ReportMetric(float64(caps[rounds/2].Microseconds())/1000, "pause-ms")
		b.ReportMetric(float64(caps[rounds-1].Microseconds())/1000, "max-pause-ms")
		b.ReportMetric(float64(pers[rounds/2].Microseconds())/1000, "persist-ms")
	}
}

// paced is a one-split source of n records at rate records/s, {"key":"k<r>"} with r random
// in [0, keys): record i is due at start + i/rate, and the latency sink measures from then
// (so a run that falls behind shows its backlog as latency instead of hiding it).
type paced struct {
	n, keys int64
	rate    float64
	mu      sync.Mutex
	start   time.Time
	lat     []time.Duration
}

func (p *paced) due(pos int64) time.Time {
	return p.start.Add(time.Duration(float64(pos) / p.rate * float64(time.Second)))
}

func (p *paced) Splits(context.Context) ([]string, error) { return []string{"paced"}, nil }
func (p *paced) Bounded() bool                            { return true }
func (p *paced) Open(ctx context.Context, splits []pipeline.Split) (pipeline.SourceReader, error) {
	p.mu.Lock()
	p.start = time.Now()
	p.mu.Unlock()
	return &pacedReader{p: p, rng: rand.New(rand.NewPCG(3, 4))}, nil
}

type pacedReader struct {
	p   *paced
	i   int64
	rng *rand.Rand
	buf []byte
}

func (r *pacedReader) Read(ctx context.Context, buf []pipeline.SourceRecord) (int, error) {
	if r.i >= r.p.n {
		return 0, io.EOF
	}
	now := time.Now()
	if d := r.p.due(r.i).Sub(now); d > 0 {
		time.Sleep(min(d, 5*time.Millisecond))
		return 0, nil
	}
	r.buf = r.buf[:0]
	n := 0
	for ; n < len(buf) && r.i < r.p.n && !r.p.due(r.i).After(now); n++ {
		from := len(r.buf)
		r.buf = append(r.buf, `{"key":"k`...)
		r.buf = strconv.AppendInt(r.buf, r.rng.Int64N(r.p.keys), 10)
		r.buf = append(r.buf, `"}`...)
		buf[n] = pipeline.SourceRecord{Value: r.buf[from:len(r.buf):len(r.buf)], Pos: r.i}
		r.i++
	}
	return n, nil
}

func (r *pacedReader) Positions() []pipeline.Split {
	return []pipeline.Split{{ID: "paced", Position: []byte(strconv.FormatInt(r.i, 10))}}
}
func (r *pacedReader) Close() error { return nil }

// latencySink records, per output, now - the due time of the source record behind it.
type latencySink struct{ p *paced }

func (s latencySink) Open(context.Context, pipeline.SinkContext) (pipeline.SinkWriter, error) {
	return s, nil
}
func (s latencySink) Committer() pipeline.SinkCommitter { return nil }
func (s latencySink) Write(_ context.Context, recs []pipeline.SinkRecord) error {
	now := time.Now()
	s.p.mu.Lock()
	for i := range recs {
		s.p.lat = append(s.p.lat, now.Sub(s.p.due(recs[i].Pos)))
	}
	s.p.mu.Unlock()
	return nil
}
func (s latencySink) PreCommit(context.Context, uint64) ([]byte, error) { return nil, nil }
func (s latencySink) Close(context.Context) error                       { return nil }

// BenchmarkPipelineLatency: the AssemblyScript counter at parallelism 1, first unpaced for
// its maximum throughput, then paced at half of it for CLINK_BENCH_LATENCY_SECONDS (default
// 5): p50, p99 and max of source-due-to-sink latency, with a checkpoint every second and,
// for comparison in the same process, with none until the final one (ckpt0-*).
func BenchmarkPipelineLatency(b *testing.B) {
	wasm := counterWasm(b)
	secs := 5.0
	if v, err := strconv.ParseFloat(os.Getenv("CLINK_BENCH_LATENCY_SECONDS"), 64); err == nil && v > 0 {
		secs = v
	}
	for b.Loop() {
		maxRate := runRate(b, counterSpec(1, 1_000_000, wasm), pipeline.Env{StateURL: "mem://"})
		b.ReportMetric(maxRate, "max-rec/s")
		b.ReportMetric(maxRate/2, "paced-rec/s")
		for _, c := range []struct{ unit, interval string }{{"", "1s"}, {"ckpt0-", "0s"}} {
			lat := pacedRun(b, wasm, maxRate/2, secs, c.interval)
			q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))].Microseconds()) / 1000 }
			b.ReportMetric(q(0.5), c.unit+"p50-ms")
			b.ReportMetric(q(0.99), c.unit+"p99-ms")
			b.ReportMetric(q(1), c.unit+"max-ms")
		}
	}
}

// pacedRun runs the counter over a paced source at rate for secs seconds, with the given
// checkpoint interval, and returns the sorted latencies.
func pacedRun(b *testing.B, wasm string, rate, secs float64, interval string) []time.Duration {
	p := &paced{rate: rate, keys: 100_000}
	p.n = int64(p.rate * secs)
	c := connectors()
	c.RegisterSource("paced", func(*pipeline.SourceSpec, *pipeline.ConnectorOptions, *pipeline.Env) (pipeline.Source, error) {
		return p, nil
	})
	c.RegisterSink("latency", func(*pipeline.SinkSpec, *pipeline.ConnectorOptions, *pipeline.Env) (pipeline.Sink, error) {
		return latencySink{p}, nil
	})
	spec := fmt.Sprintf(`
name: latency
checkpoints: {interval: %s}
sources: [{name: g, type: paced}]
operators: [{name: count, module: %s, inputs: [g], key: key}]
sinks: [{name: out, type: latency, inputs: [count]}]
`, interval, wasm)
	if _, err := runSpec(b, spec, pipeline.Env{StateURL: "mem://", Connectors: c}); err != nil {
		b.Fatal(err)
	}
	if int64(len(p.lat)) != p.n {
		b.Fatalf("%d latencies for %d records", len(p.lat), p.n)
	}
	slices.Sort(p.lat)
	return p.lat
}
