package pipeline

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/clink-wasm/clink-wasm/host/scheduler"
)

// OutputError reports an emitted value the output format rejects.
type OutputError struct {
	Operator string
	Where    string
	Key      []byte
	Err      error
}

func (e *OutputError) Error() string {
	return fmt.Sprintf("operator %q emitted an invalid value at %s (key %q): %v", e.Operator, e.Where, e.Key, e.Err)
}

func (e *OutputError) Unwrap() error { return e.Err }

// jsonlSink validates and writes JSON Lines on its own goroutine, so that validation costs the
// runner nothing. Write hands a batch over through a short queue: when the writer falls behind,
// Write blocks and backpressure reaches the source.
type jsonlSink struct {
	operator string
	describe func(int64) string
	w        *bufio.Writer
	ch       chan *scheduler.Batch
	done     chan struct{}
	once     sync.Once

	mu  sync.Mutex
	err error

	records atomic.Int64
	bytes   atomic.Int64
	compact bytes.Buffer
}

func newJSONLSink(w io.Writer, operator string, describe func(int64) string) *jsonlSink {
	s := &jsonlSink{
		operator: operator, describe: describe,
		w:  bufio.NewWriterSize(w, 256<<10),
		ch: make(chan *scheduler.Batch, 4), done: make(chan struct{}),
	}
	go s.loop()
	return s
}

func (s *jsonlSink) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *jsonlSink) setErr(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

// Write implements scheduler.Sink.
func (s *jsonlSink) Write(b *scheduler.Batch) error {
	if err := s.failure(); err != nil {
		b.Release()
		return err
	}
	s.ch <- b
	return nil
}

func (s *jsonlSink) loop() {
	defer close(s.done)
	for b := range s.ch {
		if s.failure() == nil {
			if err := s.writeBatch(b); err != nil {
				s.setErr(err)
			}
		}
		b.Release()
	}
	if err := s.w.Flush(); err != nil {
		s.setErr(fmt.Errorf("writing output: %w", err))
	}
}

func (s *jsonlSink) writeBatch(b *scheduler.Batch) error {
	for i := range b.Outputs {
		o := &b.Outputs[i]
		if o.Kind != scheduler.OutputData {
			continue
		}
		v := o.Value
		if !json.Valid(v) {
			return &OutputError{Operator: s.operator, Where: s.where(o.Src), Key: bytes.Clone(o.Src.Key), Err: invalidJSON(v)}
		}
		if bytes.ContainsAny(v, "\r\n") {
			s.compact.Reset()
			_ = json.Compact(&s.compact, v)
			v = s.compact.Bytes()
		}
		s.w.Write(v)
		if err := s.w.WriteByte('\n'); err != nil {
			return fmt.Errorf("writing output: %w", err)
		}
		s.records.Add(1)
		s.bytes.Add(int64(len(v) + 1))
	}
	return nil
}

func (s *jsonlSink) where(src scheduler.Source) string {
	if src.Timer {
		return fmt.Sprintf("timer at %d", src.TS)
	}
	if s.describe != nil {
		return s.describe(src.Pos)
	}
	return fmt.Sprintf("record #%d", src.Pos)
}

func invalidJSON(v []byte) error {
	var x any
	if err := json.Unmarshal(v, &x); err != nil {
		return fmt.Errorf("not valid JSON: %w", err)
	}
	return errors.New("not valid JSON")
}

// close drains the queue, flushes, and returns the first error.
func (s *jsonlSink) close() error {
	s.once.Do(func() { close(s.ch) })
	<-s.done
	return s.failure()
}
