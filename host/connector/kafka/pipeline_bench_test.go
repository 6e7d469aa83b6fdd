package kafka

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/connector/stdout"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Pipeline-level benchmarks: Kafka → counter (the AssemblyScript counter, 2 subtasks) → sink,
// through the pipeline runtime, against kfake in the same process. Every alternative reads the
// same 200,000 input records (1,000 keys, 3 partitions) from the start and runs in the same
// process, interleaved round by round (the order alternating), and the benchmark reports
// medians over the rounds and their ratios. Run with /work/shared/tools/bench-median for
// medians over processes.

const pipelineBenchRecords = 200_000

func benchInput(b *testing.B) Config {
	c := newCluster(b, kfake.SeedTopics(3, "in"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.DefaultProduceTopic("in"))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, 0, 5000)
	for i := range pipelineBenchRecords {
		u := "user-" + strconv.Itoa(i%1000)
		recs = append(recs, &kgo.Record{Key: []byte(u), Value: fmt.Appendf(nil, `{"user":%q,"seq":%d,"note":"some padding text"}`, u, i)})
		if len(recs) == cap(recs) || i == pipelineBenchRecords-1 {
			if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
				b.Fatal(err)
			}
			recs = recs[:0]
		}
	}
	return c
}

// runBenchPipeline runs one bounded job over the whole input and returns records per second
// (from Start to the final checkpoint committed).
func runBenchPipeline(b *testing.B, c Config, job, interval, sink string) float64 {
	brokers, _ := json.Marshal(c.Brokers)
	spec := fmt.Sprintf(`
name: %s
checkpoints: {interval: %s}
sources:
  - {name: in, type: kafka, brokers: %s, topics: [in], stop_at: latest, parallelism: 2}
operators:
  - {name: count, module: %s, inputs: [in], key: user, parallelism: 2}
sinks:
  - {name: out, inputs: [count], parallelism: 2, %s}
`, job, interval, brokers, counterWasm, sink)
	sp, err := pipeline.ParseSpec([]byte(spec))
	if err != nil {
		b.Fatal(err)
	}
	conns := &pipeline.Connectors{}
	Register(conns)
	stdout.Register(conns, nil)
	start := time.Now()
	j, err := pipeline.Start(context.Background(), sp, pipeline.Env{Connectors: conns, StateURL: "file://" + b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	m, err := j.Wait()
	if err != nil {
		b.Fatal(err)
	}
	el := time.Since(start)
	var in int64
	for _, s := range m.Sources {
		in += s.RecordsIn
	}
	if in != pipelineBenchRecords {
		b.Fatalf("%s read %d records", job, in)
	}
	return float64(in) / el.Seconds()
}

// plainLoop is what the pipeline does, by hand: a franz-go consumer (read_committed) counting
// per key in a Go map and, if produce, producing {"key","count"} for every record with an
// idempotent producer, flushed at the end.
func plainLoop(b *testing.B, c Config, out string) float64 {
	ctx := context.Background()
	start := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.ConsumeTopics("in"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.DefaultProduceTopic(out), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	counts := map[string]int{}
	var buf []byte
	for got := 0; got < pipelineBenchRecords; {
		fs := cl.PollRecords(ctx, 1000)
		var perr error
		fs.EachRecord(func(r *kgo.Record) {
			got++
			var v struct{ User string }
			if err := json.Unmarshal(r.Value, &v); err != nil {
				perr = err
				return
			}
			counts[v.User]++
			if out != "" {
				buf = fmt.Appendf(buf[:0], `{"key":%q,"count":%d}`, v.User, counts[v.User])
				cl.Produce(ctx, &kgo.Record{Key: []byte(v.User), Value: append([]byte(nil), buf...)}, func(_ *kgo.Record, err error) {
					if err != nil {
						perr = err
					}
				})
			}
		})
		if perr != nil {
			b.Fatal(perr)
		}
	}
	if out != "" {
		if err := cl.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return pipelineBenchRecords / time.Since(start).Seconds()
}

// BenchmarkPipelineKafka reports, for checkpoint intervals of 20ms, 100ms and 1s (about 2,000,
// 10,000 and 100,000 outputs per checkpoint at the rates here):
//   - eo/alo: Kafka → counter → Kafka exactly once ÷ at least once (issue 13: ≥ 0.7);
//   - discard/plain: Kafka → counter → discard ÷ a plain consumer loop counting in a map;
//   - eo/plain-produce: Kafka → counter → Kafka exactly once ÷ a plain consume → count →
//     produce loop (no checkpoints, no state, no transactions).
func BenchmarkPipelineKafka(b *testing.B) {
	for _, interval := range []string{"20ms", "100ms", "1s"} {
		b.Run("interval="+interval, func(b *testing.B) {
			for b.Loop() {
				c := benchInput(b)
				brokers, _ := json.Marshal(c.Brokers)
				var eo, alo, disc, plain, plainP []float64
				for r := range benchRounds {
					runs := []func(){
						func() {
							eo = append(eo, runBenchPipeline(b, c, fmt.Sprintf("eo%d", r), interval,
								fmt.Sprintf("type: kafka, brokers: %s, topic: out-eo-%d", brokers, r)))
						},
						func() {
							alo = append(alo, runBenchPipeline(b, c, fmt.Sprintf("alo%d", r), interval,
								fmt.Sprintf("type: kafka, brokers: %s, topic: out-alo-%d, mode: at_least_once", brokers, r)))
						},
						func() {
							disc = append(disc, runBenchPipeline(b, c, fmt.Sprintf("disc%d", r), interval, "type: discard"))
						},
						func() { plain = append(plain, plainLoop(b, c, "")) },
						func() { plainP = append(plainP, plainLoop(b, c, fmt.Sprintf("out-plain-%d", r))) },
					}
					for _, t := range []string{fmt.Sprintf("out-eo-%d", r), fmt.Sprintf("out-alo-%d", r), fmt.Sprintf("out-plain-%d", r)} {
						createTopic(b, c, t, 3)
					}
					for i := range runs { // a different order each round
						runs[(i+r)%len(runs)]()
					}
				}
				b.ReportMetric(median(eo), "eo-rec/s")
				b.ReportMetric(median(alo), "alo-rec/s")
				b.ReportMetric(median(eo)/median(alo), "eo/alo")
				b.ReportMetric(median(disc)/median(plain), "discard/plain")
				b.ReportMetric(median(eo)/median(plainP), "eo/plain-produce")
			}
		})
	}
}

func createTopic(b *testing.B, c Config, topic string, partitions int32) {
	cl, err := c.newClient()
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(context.Background(), partitions, -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		b.Fatal(err)
	}
}
