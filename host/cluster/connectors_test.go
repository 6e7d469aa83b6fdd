package cluster

import (
	"context"

	"github.com/clink-wasm/clink-wasm/host/connector/kafka"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// connectors returns the tasks' registry: the kafka source and sink, and the collect sink (at least
// once, into the cluster's memory).
func (c *testCluster) connectors() *pipeline.Connectors {
	conns := &pipeline.Connectors{}
	kafka.Register(conns)
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
