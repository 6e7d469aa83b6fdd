package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/clink-wasm/clink-wasm/host/connector/kafka"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// connectors returns the tasks' registry: a kafka source and the collect sink (at least
// once, into the cluster's memory).
func (c *testCluster) connectors() *pipeline.Connectors {
	conns := &pipeline.Connectors{}
	conns.RegisterSource("kafka", newTestKafkaSource)
	conns.RegisterSink("collect", func(spec *pipeline.SinkSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Sink, error) {
		return &collectSink{c: c}, nil
	})
	return conns
}

type collectSink struct{ c *testCluster }

func (s *collectSink) Committer() pipeline.SinkCommitter { return nil }
func (s *collectSink) Open(ctx context.Context, sc pipeline.SinkContext) (pipeline.SinkWriter, error) {
	return &collectWriter{c: s.c, task: sc.Job}, nil
}

type collectWriter struct {
	c    *testCluster
	task string
}

func (w *collectWriter) Write(ctx context.Context, recs []pipeline.SinkRecord) error {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	for _, r := range recs {
		w.c.outs = append(w.c.outs, collected{task: w.task, key: string(r.Key), value: string(r.Value)})
	}
	return nil
}
func (w *collectWriter) PreCommit(ctx context.Context, n uint64) ([]byte, error) { return nil, nil }
func (w *collectWriter) Close(ctx context.Context) error                         { return nil }

// testKafkaSource is a minimal pipeline source over kafka.Source.
type testKafkaSource struct{ sc kafka.SourceConfig }

func newTestKafkaSource(spec *pipeline.SourceSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Source, error) {
	var sc kafka.SourceConfig
	sc.Brokers = nil
	if v, ok := spec.Options["brokers"].([]any); ok {
		for _, b := range v {
			sc.Brokers = append(sc.Brokers, fmt.Sprint(b))
		}
	}
	if v, ok := spec.Options["topics"].([]any); ok {
		for _, b := range v {
			sc.Topics = append(sc.Topics, fmt.Sprint(b))
		}
	}
	sc.StartFrom = o.String("start_from", "")
	// The options map is the one o wraps (the task's own copy of the spec): what was read
	// above is removed so that o.Finish does not report it.
	delete(spec.Options, "brokers")
	delete(spec.Options, "topics")
	return &testKafkaSource{sc: sc}, sc.Validate()
}

func (s *testKafkaSource) Bounded() bool { return false }
func (s *testKafkaSource) Splits(ctx context.Context) ([]string, error) {
	src, err := kafka.NewSource(s.sc)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	sp, err := src.Splits(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, x := range sp {
		ids = append(ids, x.String())
	}
	return ids, nil
}

func (s *testKafkaSource) Open(ctx context.Context, splits []pipeline.Split) (pipeline.SourceReader, error) {
	r := &testReader{index: map[kafka.Split]int{}}
	from := kafka.Positions{}
	for i, ps := range splits {
		j := strings.LastIndexByte(ps.ID, '/')
		p, _ := strconv.Atoi(ps.ID[j+1:])
		sp := kafka.Split{Topic: ps.ID[:j], Partition: int32(p)}
		if ps.Position != nil {
			var off int64
			if err := json.Unmarshal(ps.Position, &off); err != nil {
				return nil, err
			}
			from[sp] = off
		}
		r.splits = append(r.splits, sp)
		r.index[sp] = i
	}
	src, err := kafka.NewSource(s.sc)
	if err != nil {
		return nil, err
	}
	if err := src.Open(ctx, r.splits, from); err != nil {
		src.Close()
		return nil, err
	}
	r.src = src
	return r, nil
}

type testReader struct {
	src    *kafka.Source
	splits []kafka.Split
	index  map[kafka.Split]int
}

func (r *testReader) Read(ctx context.Context, buf []pipeline.SourceRecord) (int, error) {
	recs, err := r.src.Poll(ctx, 20*time.Millisecond, len(buf))
	if err != nil {
		return 0, err
	}
	for i, rec := range recs {
		buf[i] = pipeline.SourceRecord{Split: r.index[rec.Split], Value: rec.Value, Key: rec.Key, TS: rec.Time, HasTS: true, Pos: rec.Offset}
	}
	return len(recs), nil
}

func (r *testReader) Positions() []pipeline.Split {
	pos := r.src.Positions()
	out := make([]pipeline.Split, len(r.splits))
	for i, sp := range r.splits {
		out[i] = pipeline.Split{ID: sp.String()}
		if off, ok := pos[sp]; ok {
			out[i].Position = json.RawMessage(strconv.FormatInt(off, 10))
		}
	}
	return out
}

func (r *testReader) Close() error { r.src.Close(); return nil }
