package kafka

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The benchmarks measure their alternatives side by side, interleaved, in one run, and report
// the ratio: run them with /work/shared/tools/bench-median (-benchtime 1x), which repeats the
// whole run in separate processes. kfake runs in the same process and competes for the CPU,
// so absolute rates are low; the ratios are what carry.

const benchRounds = 3

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkSinkModes: the producer path, exactly once ÷ at least once. Each round writes 40
// epochs of outputs of 100 bytes over 1,000 keys to a 3-partition topic, with a checkpoint
// (PreCommit, Commit) every 5,000 or 50,000 outputs (40 epochs, so that a sink's first epoch,
// with its metadata and producer ID requests, does not dominate; with 4, it did) (at the rates here, every few ms or every few tens of
// ms: far more often than a pipeline checkpoints, so the per-epoch cost shows). eo commits
// each epoch before writing the next; eo-overlap commits epoch n in another goroutine while
// epoch n+1 is written, as the pipeline does (its coordinator decides n while the sink subtask
// goes on), waiting for it only before pre-committing n+1.
func BenchmarkSinkModes(b *testing.B) {
	for _, every := range []int{5_000, 50_000} {
		b.Run(fmt.Sprintf("every=%d", every), func(b *testing.B) { benchSinkModes(b, 40*every, every) })
	}
}

func benchSinkModes(b *testing.B, n, every int) {
	value := make([]byte, 100)
	keys := make([][]byte, 1000)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%d", i)
	}
	for b.Loop() {
		c := newCluster(b, kfake.SeedTopics(3, "out"))
		ctx := context.Background()
		round := func(mode string, job string, overlap bool) float64 {
			sc := SinkConfig{Config: c, Topic: "out", Mode: mode}
			s, err := NewSink(ctx, sc, Identity{Job: job, Sink: "s"}, 1)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			start := time.Now()
			epoch := uint64(1)
			var committed chan error
			for i := range n {
				if err := s.Write(ctx, Output{Key: keys[i%len(keys)], Value: value}); err != nil {
					b.Fatal(err)
				}
				if (i+1)%every == 0 {
					if committed != nil {
						if err := <-committed; err != nil {
							b.Fatal(err)
						}
					}
					if _, err := s.PreCommit(ctx, Marker{Epoch: epoch, Manifest: "m"}); err != nil {
						b.Fatal(err)
					}
					if overlap {
						committed = make(chan error, 1)
						go func(e uint64) { committed <- s.Commit(ctx, e) }(epoch)
					} else if err := s.Commit(ctx, epoch); err != nil {
						b.Fatal(err)
					}
					epoch++
				}
			}
			if committed != nil {
				if err := <-committed; err != nil {
					b.Fatal(err)
				}
			}
			return float64(n) / time.Since(start).Seconds()
		}
		var eo, eov, alo []float64
		for r := range benchRounds {
			// Rotate which mode goes first, so that warm-up favours none.
			runs := []func(){
				func() { alo = append(alo, round(AtLeastOnce, fmt.Sprintf("alo%d", r), false)) },
				func() { eo = append(eo, round(ExactlyOnce, fmt.Sprintf("eo%d", r), false)) },
				func() { eov = append(eov, round(ExactlyOnce, fmt.Sprintf("eov%d", r), true)) },
			}
			for i := range runs {
				runs[(i+r)%len(runs)]()
			}
		}
		b.ReportMetric(median(alo), "alo-rec/s")
		b.ReportMetric(median(eo), "eo-rec/s")
		b.ReportMetric(median(eo)/median(alo), "eo/alo")
		b.ReportMetric(median(eov)/median(alo), "eo-overlap/alo")
	}
}

// BenchmarkSourceVsPlain: reading 400,000 JSON records and counting them per key in a Go
// map, through the Source (raw values; JSON values, which it validates; the key from a JSON
// field), ÷ a plain franz-go consumer loop doing the same without any check.
func BenchmarkSourceVsPlain(b *testing.B) {
	const n = 400_000
	for b.Loop() {
		c := newCluster(b, kfake.SeedTopics(3, "in"))
		ctx := context.Background()
		cl, _ := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.DefaultProduceTopic("in"))
		recs := make([]*kgo.Record, 0, 1000)
		for i := range n {
			k := fmt.Sprintf("key-%d", i%1000)
			recs = append(recs, &kgo.Record{Key: []byte(k), Value: fmt.Appendf(nil, `{"user":%q,"amount":%d,"note":"some padding text here"}`, k, i)})
			if len(recs) == cap(recs) {
				if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
					b.Fatal(err)
				}
				recs = recs[:0]
			}
		}
		cl.Close()
		plain := func() float64 {
			start := time.Now()
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.ConsumeTopics("in"),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
			if err != nil {
				b.Fatal(err)
			}
			defer cl.Close()
			counts := map[string]int{}
			for got := 0; got < n; {
				fs := cl.PollRecords(ctx, 1000)
				fs.EachRecord(func(r *kgo.Record) { counts[string(r.Key)]++; got++ })
			}
			return n / time.Since(start).Seconds()
		}
		source := func(field, value string) float64 {
			start := time.Now()
			s, err := NewSource(SourceConfig{Config: c, Topics: []string{"in"}, KeyField: field, Value: value})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			splits, err := s.Splits(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Open(ctx, splits, nil); err != nil {
				b.Fatal(err)
			}
			counts := map[string]int{}
			for got := 0; got < n; {
				rs, err := s.Poll(ctx, time.Second, 1000)
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range rs {
					counts[string(r.Key)]++
				}
				got += len(rs)
			}
			if len(counts) != 1000 {
				b.Fatalf("%d keys", len(counts))
			}
			return n / time.Since(start).Seconds()
		}
		var p, sr, sk, sf []float64
		for range benchRounds {
			p = append(p, plain()) // each reads the topic from the start with a new client
			sr = append(sr, source("", "raw"))
			sk = append(sk, source("", "json"))
			sf = append(sf, source("user", "json"))
		}
		b.ReportMetric(median(p), "plain-rec/s")
		b.ReportMetric(median(sr)/median(p), "source-raw/plain")
		b.ReportMetric(median(sk)/median(p), "source/plain")
		b.ReportMetric(median(sf)/median(p), "source-keyfield/plain")
	}
}
