package file

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// Sink writes JSON Lines to one file, exactly once.
//
// Each sink subtask writes the records of a checkpoint interval to a part file in the hidden
// directory .NAME.pending next to the output, and on the barrier fsyncs it and names it in its
// handle (pre-commit: durable, invisible). Once the checkpoint record is durable the committer
// appends the parts, in subtask order, to the output and fsyncs it. The record holds the
// output's length before and after (base, end), which makes the commit idempotent: an output
// of length end is committed; of a length in [base, end) it is truncated to base and appended
// again. Recovery re-commits the restored checkpoint, truncates anything beyond its end, and
// deletes every part file: the committed output is then exactly the restored checkpoint's.
type Sink struct {
	path    string
	pending string
	fsync   bool

	mu  sync.Mutex
	end int64 // committed length
}

// NewSink builds a file sink: path (required), fsync (default true).
func NewSink(spec *pipeline.SinkSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Sink, error) {
	path := o.String("path", "")
	fsync := o.Bool("fsync", true)
	if path == "" {
		o.Fail("path", "required: the output file")
		return nil, nil
	}
	full := env.Path(path)
	if st, err := os.Stat(full); err == nil && st.IsDir() {
		o.Fail("path", "%s is a directory", full)
		return nil, nil
	}
	if _, err := os.Stat(filepath.Dir(full)); err != nil {
		o.Fail("path", "the directory of %s: %v", full, err)
		return nil, nil
	}
	return &Sink{path: full, pending: filepath.Join(filepath.Dir(full), "."+filepath.Base(full)+".pending"), fsync: fsync}, nil
}

// Committer implements pipeline.Sink.
func (s *Sink) Committer() pipeline.SinkCommitter { return s }

// Open implements pipeline.Sink.
func (s *Sink) Open(ctx context.Context, sc pipeline.SinkContext) (pipeline.SinkWriter, error) {
	if err := os.MkdirAll(s.pending, 0o755); err != nil {
		return nil, err
	}
	return &writer{pw: PartWriter{Dir: s.pending, Subtask: sc.Subtask, Fsync: s.fsync, BufSize: 256 << 10}}, nil
}

type writer struct {
	pw PartWriter
}

func (w *writer) Write(ctx context.Context, recs []pipeline.SinkRecord) error {
	return w.pw.Write(recs)
}

func (w *writer) PreCommit(ctx context.Context, checkpoint uint64) ([]byte, error) {
	return w.pw.PreCommit(checkpoint)
}

func (w *writer) Close(ctx context.Context) error { return w.pw.Abandon() }

// Prepare implements pipeline.SinkCommitter.
func (s *Sink) Prepare(ctx context.Context, checkpoint uint64, handles [][]byte) ([]byte, error) {
	s.mu.Lock()
	base := s.end
	s.mu.Unlock()
	p, err := GatherParts(base, handles)
	if err != nil {
		return nil, err
	}
	return json.Marshal(p)
}

// Commit implements pipeline.SinkCommitter.
func (s *Sink) Commit(ctx context.Context, checkpoint uint64, prep []byte) error {
	var p Parts
	if err := json.Unmarshal(prep, &p); err != nil {
		return fmt.Errorf("bad prepared state: %w", err)
	}
	if err := CommitParts(s.path, s.pending, p, s.fsync); err != nil {
		return err
	}
	s.mu.Lock()
	s.end = p.End
	s.mu.Unlock()
	return nil
}

// Recover implements pipeline.SinkCommitter.
func (s *Sink) Recover(ctx context.Context, checkpoint uint64, prep []byte) error {
	var p Parts
	if prep != nil {
		if err := json.Unmarshal(prep, &p); err != nil {
			return fmt.Errorf("bad prepared state: %w", err)
		}
		if err := CommitParts(s.path, s.pending, p, s.fsync); err != nil {
			return err
		}
	}
	// Everything after the restored checkpoint is uncommitted: truncate it, delete the parts.
	if err := DiscardAfter(s.path, s.pending, p.End, s.fsync); err != nil {
		return err
	}
	s.mu.Lock()
	s.end = p.End
	s.mu.Unlock()
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
