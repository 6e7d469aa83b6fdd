package file

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
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

// handle is a subtask's pre-commit: the part file and its size (none when empty).
type handle struct {
	Part  string `json:"part,omitempty"`
	Bytes int64  `json:"bytes"`
}

// prepared is the sink's part of a checkpoint record.
type prepared struct {
	Base  int64    `json:"base"`
	End   int64    `json:"end"`
	Parts []string `json:"parts,omitempty"`
}

type writer struct {
	pw PartWriter
}

func (w *writer) Write(ctx context.Context, recs []pipeline.SinkRecord) error {
	return w.pw.Write(recs)
}

func (w *writer) PreCommit(ctx context.Context, checkpoint uint64) ([]byte, error) {
	part, n, err := w.pw.Stage(checkpoint)
	if err != nil {
		return nil, err
	}
	return json.Marshal(handle{Part: part, Bytes: n})
}

func (w *writer) Close(ctx context.Context) error { return w.pw.Abandon() }

// Prepare implements pipeline.SinkCommitter.
func (s *Sink) Prepare(ctx context.Context, checkpoint uint64, handles [][]byte) ([]byte, error) {
	s.mu.Lock()
	p := prepared{Base: s.end, End: s.end}
	s.mu.Unlock()
	for i, hb := range handles {
		var h handle
		if err := json.Unmarshal(hb, &h); err != nil {
			return nil, fmt.Errorf("subtask %d's handle: %w", i, err)
		}
		if h.Part != "" {
			p.Parts = append(p.Parts, h.Part)
			p.End += h.Bytes
		}
	}
	return json.Marshal(p)
}

// Commit implements pipeline.SinkCommitter.
func (s *Sink) Commit(ctx context.Context, checkpoint uint64, prep []byte) error {
	var p prepared
	if err := json.Unmarshal(prep, &p); err != nil {
		return fmt.Errorf("bad prepared state: %w", err)
	}
	if err := s.commit(&p); err != nil {
		return err
	}
	s.mu.Lock()
	s.end = p.End
	s.mu.Unlock()
	return nil
}

func (s *Sink) commit(p *prepared) error {
	f, err := os.OpenFile(s.path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	if size < p.Base {
		return fmt.Errorf("%s is %d bytes, shorter than its committed %d: was it changed by something else?", s.path, size, p.Base)
	}
	if size != p.End {
		if err := f.Truncate(p.Base); err != nil {
			return err
		}
		if _, err := f.Seek(p.Base, io.SeekStart); err != nil {
			return err
		}
		for _, part := range p.Parts {
			pf, err := os.Open(filepath.Join(s.pending, part))
			if err != nil {
				return fmt.Errorf("committing: part %s: %w", part, err)
			}
			_, err = io.Copy(f, pf)
			pf.Close()
			if err != nil {
				return err
			}
		}
		if s.fsync {
			if err := f.Sync(); err != nil {
				return err
			}
		}
		if st, err := f.Stat(); err != nil {
			return err
		} else if st.Size() != p.End {
			return fmt.Errorf("committed %s is %d bytes, expected %d", s.path, st.Size(), p.End)
		}
	}
	for _, part := range p.Parts {
		if err := os.Remove(filepath.Join(s.pending, part)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Recover implements pipeline.SinkCommitter.
func (s *Sink) Recover(ctx context.Context, checkpoint uint64, prep []byte) error {
	var p prepared
	if prep != nil {
		if err := json.Unmarshal(prep, &p); err != nil {
			return fmt.Errorf("bad prepared state: %w", err)
		}
		if err := s.commit(&p); err != nil {
			return err
		}
	}
	// Everything after the restored checkpoint is uncommitted: truncate it, delete the parts.
	f, err := os.OpenFile(s.path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if err := f.Truncate(p.End); err != nil {
		f.Close()
		return err
	}
	if s.fsync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	f.Close()
	ents, err := os.ReadDir(s.pending)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".part") || strings.HasPrefix(e.Name(), "inprogress-") {
			if err := os.Remove(filepath.Join(s.pending, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
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
