// Package stdout has the non-transactional sinks of pipelines: stdout, which writes JSON Lines
// to the process's standard output (or any writer) as records arrive, and discard, which only
// counts. Neither takes part in checkpoints: after a restore, stdout repeats what it printed
// since the restored checkpoint (at least once).
package stdout

import (
	"context"
	"io"
	"os"
	"sync"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// Register adds the stdout sink (writing to w, os.Stdout when nil) and the discard sink.
func Register(c *pipeline.Connectors, w io.Writer) {
	if w == nil {
		w = os.Stdout
	}
	out := &shared{w: w}
	c.RegisterSink("stdout", func(spec *pipeline.SinkSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Sink, error) {
		return &sink{out: out}, nil
	})
	c.RegisterSink("discard", func(spec *pipeline.SinkSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Sink, error) {
		return &sink{}, nil
	})
}

// shared serialises the subtasks' writes to one writer, a batch at a time.
type shared struct {
	mu sync.Mutex
	w  io.Writer
}

type sink struct{ out *shared }

func (s *sink) Committer() pipeline.SinkCommitter { return nil }

func (s *sink) Open(ctx context.Context, sc pipeline.SinkContext) (pipeline.SinkWriter, error) {
	return &writer{out: s.out}, nil
}

type writer struct {
	out *shared
	buf []byte
}

func (w *writer) Write(ctx context.Context, recs []pipeline.SinkRecord) error {
	if w.out == nil {
		return nil
	}
	w.buf = w.buf[:0]
	for i := range recs {
		w.buf = append(w.buf, recs[i].Value...)
		w.buf = append(w.buf, '\n')
	}
	w.out.mu.Lock()
	defer w.out.mu.Unlock()
	_, err := w.out.w.Write(w.buf)
	return err
}

func (w *writer) PreCommit(ctx context.Context, checkpoint uint64) ([]byte, error) {
	if w.out != nil {
		w.out.mu.Lock()
		defer w.out.mu.Unlock()
		if f, ok := w.out.w.(interface{ Flush() error }); ok {
			return nil, f.Flush()
		}
	}
	return nil, nil
}

func (w *writer) Close(ctx context.Context) error { return nil }
