package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// SourceType and SinkType are the connector types of hosted pipelines' spec.
const (
	SourceType = "http"
	SinkType   = "preview"
)

// SplitID is the ingest source's one split.
const SplitID = "ingest"

// Register adds the HTTP ingest source, reading log, and the preview sink, keeping each sink's
// latest committed outputs under dir (preview.go), to c. log may be nil to validate specs
// only (the source then cannot open).
func Register(c *pipeline.Connectors, log *Log, dir string) { RegisterObserved(c, log, dir, nil) }

// RegisterObserved is Register with observe, when not nil, called after every write to a
// preview sink with the sink's name and how many records were written. It runs in the writing
// subtask's goroutine and must not block. A caller can so wait for a sink's progress without
// polling (BenchmarkNoisyNeighbour's closed loop: a poll's sleep of 200 µs takes ~1 ms when the
// process is idle, Go's timers waiting in epoll with millisecond resolution).
func RegisterObserved(c *pipeline.Connectors, log *Log, dir string, observe func(sink string, n int)) {
	c.RegisterSource(SourceType, func(spec *pipeline.SourceSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Source, error) {
		if spec.Parallelism > 1 {
			o.Fail("parallelism", "the http source has one split (the ingest log); parallelism must be 1")
		}
		return &source{log: log}, nil
	})
	c.RegisterSink(SinkType, func(spec *pipeline.SinkSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Sink, error) {
		s, err := newPreviewSink(dir, spec, o)
		if s == nil || err != nil {
			if err == nil && dir == "" {
				return validateOnly{}, nil
			}
			return nil, err
		}
		s.observe = observe
		return s, nil
	})
}

type validateOnly struct{}

func (validateOnly) Open(context.Context, pipeline.SinkContext) (pipeline.SinkWriter, error) {
	return nil, fmt.Errorf("ingest: the preview sink was built to validate a spec only")
}
func (validateOnly) Committer() pipeline.SinkCommitter { return nil }

type source struct{ log *Log }

func (s *source) Splits(context.Context) ([]string, error) { return []string{SplitID}, nil }
func (s *source) Bounded() bool                            { return false }

type position struct {
	Offset int64 `json:"offset"`
	Left   int   `json:"left,omitempty"`
}

func (s *source) Open(ctx context.Context, splits []pipeline.Split) (pipeline.SourceReader, error) {
	if s.log == nil {
		return nil, fmt.Errorf("ingest: no log to read (validation only)")
	}
	var p position
	for _, sp := range splits {
		if sp.ID != SplitID {
			return nil, fmt.Errorf("ingest: unknown split %q", sp.ID)
		}
		if len(sp.Position) > 0 {
			if err := json.Unmarshal(sp.Position, &p); err != nil {
				return nil, fmt.Errorf("ingest: bad position %s: %w", sp.Position, err)
			}
		}
	}
	if len(splits) == 0 {
		return &reader{}, nil
	}
	r, err := s.log.NewReader(p.Offset, p.Left)
	if err != nil {
		return nil, err
	}
	return &reader{r: r}, nil
}

type reader struct {
	r    *Reader
	recs []Record
}

func (r *reader) Read(ctx context.Context, buf []pipeline.SourceRecord) (int, error) {
	if r.r == nil {
		return 0, io.EOF
	}
	if cap(r.recs) < len(buf) {
		r.recs = make([]Record, len(buf))
	}
	n, err := r.r.Next(ctx, r.recs[:len(buf)])
	for i := 0; i < n; i++ {
		buf[i] = pipeline.SourceRecord{Value: r.recs[i].Value, Pos: r.recs[i].Pos}
	}
	if err == ErrClosed {
		err = io.EOF
	}
	return n, err
}

func (r *reader) Positions() []pipeline.Split {
	if r.r == nil {
		return nil
	}
	off, left := r.r.Pos()
	b, _ := json.Marshal(position{Offset: off, Left: left})
	return []pipeline.Split{{ID: SplitID, Position: b}}
}

func (r *reader) Close() error {
	if r.r == nil {
		return nil
	}
	return r.r.Close()
}

// Tail returns the last n complete lines of the file at path (none if it does not exist) and
// the offset after them, reading at most maxBytes from the end.
func Tail(path string, n int, maxBytes int64) ([][]byte, int64, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	size := st.Size()
	from := max(0, size-maxBytes)
	buf := make([]byte, size-from)
	if _, err := f.ReadAt(buf, from); err != nil && err != io.EOF {
		return nil, 0, err
	}
	end := bytes.LastIndexByte(buf, '\n') + 1 // only complete lines
	buf = buf[:end]
	lines := bytes.Split(bytes.TrimSuffix(buf, []byte("\n")), []byte("\n"))
	if len(buf) == 0 {
		lines = nil
	}
	if from > 0 && len(lines) > 0 {
		lines = lines[1:] // the first may be partial
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines, from + int64(end), nil
}

// ReadFrom returns the complete lines of the file at path from offset on (up to maxBytes), and
// the offset after them. A file shorter than offset (truncated by a restore) restarts at 0
// with reset set.
func ReadFrom(path string, offset, maxBytes int64) (lines [][]byte, next int64, reset bool, err error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, 0, offset > 0, nil
	}
	if err != nil {
		return nil, offset, false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, offset, false, err
	}
	if st.Size() < offset {
		offset, reset = 0, true
	}
	buf := make([]byte, min(st.Size()-offset, maxBytes))
	if _, err := f.ReadAt(buf, offset); err != nil && err != io.EOF {
		return nil, offset, reset, err
	}
	end := bytes.LastIndexByte(buf, '\n') + 1
	if end == 0 {
		return nil, offset, reset, nil
	}
	return bytes.Split(buf[:end-1], []byte("\n")), offset + int64(end), reset, nil
}
