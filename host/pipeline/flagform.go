package pipeline

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/replay"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// # The flag form
//
// Run is `clink-wasm run --module OP.wasm --input FILE`: a shorthand for a one-operator spec,
// input → operator → output, run by the same runtime as `run --pipeline` (Start). Its source
// reads Options.Input with the flag form's parsers (JSON Lines, CSV with typed cells, a
// leading BOM skipped, malformed lines to the dead-letter output) and records a byte offset
// as its position; its sink writes Options.Output and, when that is a regular file named by
// OutputName, takes part in checkpoints: it is fsynced on the barrier and truncated on restore
// to the restored checkpoint's end, so that the committed output is exactly once. The runtime
// reports back to Run through the flagForm hooks.

// The node names of the flag form's one-operator spec.
const (
	flagSourceName     = "input"
	flagSinkName       = "output"
	flagDeadLetterName = "dead-letter"
)

// flagForm is what the flag form hooks into the runtime: its preloaded module, its messages,
// the recording, and the metrics it reports. Every method is safe on nil (specs have none).
type flagForm struct {
	bin    []byte
	eng    *abi.Engine
	mod    *abi.Module
	record *replay.Recorder

	mu          sync.Mutex
	sched       scheduler.Snapshot
	maxInFlight int
	stateM      *state.Metrics
	lookups     map[string]lookup.Metrics
	checkpoints []uint64
	ckptBytes   int64
	last        *CheckpointInfo
	migration   *MigrationStats
}

// migrated records a host-driven migration of the restored state (migrate.go).
func (f *flagForm) migrated(st MigrationStats) {
	f.mu.Lock()
	f.migration = &st
	f.mu.Unlock()
}

func (f *flagForm) describe(pos int64) string { return fmt.Sprintf("input line %d", pos) }

func (f *flagForm) operatorDone(c *scheduler.Controller, b *state.Tiered) {
	if f == nil {
		return
	}
	m := b.Metrics()
	f.mu.Lock()
	f.sched, f.maxInFlight, f.stateM = c.Metrics(), c.MaxInFlight(), &m
	f.mu.Unlock()
}

// recording is the recorder of a flag-form run that records (host/replay), else nil.
func (f *flagForm) recording() *replay.Recorder {
	if f == nil {
		return nil
	}
	return f.record
}

func (f *flagForm) lookupsDone(m map[string]lookup.Metrics) {
	if f == nil {
		return
	}
	f.mu.Lock()
	f.lookups = m
	f.mu.Unlock()
}

func (f *flagForm) checkpointDone(info CheckpointInfo) {
	if f == nil {
		return
	}
	f.mu.Lock()
	f.checkpoints = append(f.checkpoints, info.ID)
	f.ckptBytes += info.StateBytes
	f.last = &info
	f.mu.Unlock()
}

// tapInput passes an operator's input through tap (a recording) on its way to the
// controller. After tap fails, the rest of the input is drained and not passed on; the
// returned func then reports the failure, which fails the operator.
func tapInput(in <-chan []scheduler.Element, tap func([]scheduler.Element) error) (<-chan []scheduler.Element, func() error) {
	out := make(chan []scheduler.Element, 2)
	var failed atomic.Pointer[error]
	go func() {
		defer close(out)
		for b := range in {
			if failed.Load() != nil {
				continue
			}
			if err := tap(b); err != nil {
				failed.Store(&err)
				continue
			}
			out <- b
		}
	}()
	return out, func() error {
		if p := failed.Load(); p != nil {
			return *p
		}
		return nil
	}
}

// --- the source ---

// readerPosition is the flag form's input position: the byte offset after the last record
// read, its line number, and the CSV header (the rows after the offset need it).
type readerPosition struct {
	Offset int64    `json:"offset"`
	Line   int64    `json:"line"`
	Header []string `json:"header,omitempty"`
	Done   bool     `json:"done,omitempty"`
}

// readerSource reads Options.Input, once.
type readerSource struct {
	opts     *Options
	split    string
	maxKey   int
	maxValue int

	opened  atomic.Bool
	base    atomic.Int64 // the offset the reading started from (a restore's)
	cur     atomic.Pointer[source]
	recs    atomic.Int64
	skipped atomic.Int64
	// failed is what ended the input early (a malformed record under fail, a read error): the
	// source then ends as if the input ended there, so that the records before it are
	// processed, written and covered by the final checkpoint, and Run reports it.
	failed atomic.Pointer[error]
}

func (s *readerSource) failure() error {
	if p := s.failed.Load(); p != nil {
		return *p
	}
	return nil
}

func (s *readerSource) Splits(context.Context) ([]string, error) { return []string{s.split}, nil }
func (s *readerSource) Bounded() bool                            { return true }

// bytesRead is the input read so far, for progress.
func (s *readerSource) bytesRead() int64 {
	n := s.base.Load()
	if src := s.cur.Load(); src != nil {
		n += src.r.n.Load()
	}
	return n
}

func (s *readerSource) Open(ctx context.Context, splits []Split) (SourceReader, error) {
	if !s.opened.CompareAndSwap(false, true) {
		return nil, errors.New("the input can be read only once")
	}
	var pos readerPosition
	for _, sp := range splits {
		if sp.ID == s.split && sp.Position != nil {
			if err := json.Unmarshal(sp.Position, &pos); err != nil {
				return nil, fmt.Errorf("input %s: bad checkpoint position %q: %w", s.split, sp.Position, err)
			}
		}
	}
	in := s.opts.Input
	if pos.Offset > 0 {
		// Skip what the checkpoint covers: seek a file, read past it in a stream.
		f, isFile := in.(*os.File)
		st, err := statOf(f, isFile)
		switch {
		case err == nil && st.Mode().IsRegular():
			if st.Size() < pos.Offset {
				return nil, fmt.Errorf("input %s is %d bytes, shorter than the checkpoint's position %d: the input changed since", s.split, st.Size(), pos.Offset)
			}
			if _, err := f.Seek(pos.Offset, io.SeekStart); err != nil {
				return nil, fmt.Errorf("input %s: skipping what the checkpoint covers: %w", s.split, err)
			}
		default:
			n, err := io.CopyN(io.Discard, in, pos.Offset)
			if err != nil {
				return nil, fmt.Errorf("input %s ended after %d bytes, before the checkpoint's position %d: the input changed since", s.split, n, pos.Offset)
			}
		}
	}
	src := newSource(sourceConfig{
		format: s.opts.Format, keyField: s.opts.KeyField, timeField: s.opts.TimeField,
		policy: s.opts.OnMalformed, deadLetter: s.opts.DeadLetter, maxKey: s.maxKey, maxValue: s.maxValue,
	}, in)
	if pos.Offset > 0 {
		src.in = src.r // a BOM is only at the very start
		src.line, src.lineBase = pos.Line, pos.Line
		src.csvHeader = pos.Header
	}
	s.base.Store(pos.Offset)
	s.cur.Store(src)
	r := &readerReader{s: s, src: src, pos: pos}
	r.next = src.jsonLines
	if s.opts.Format == FormatCSV {
		r.next = src.csvRecords()
	}
	return r, nil
}

func statOf(f *os.File, ok bool) (os.FileInfo, error) {
	if !ok || f == nil {
		return nil, errors.New("not a file")
	}
	return f.Stat()
}

type readerReader struct {
	s    *readerSource
	src  *source
	pos  readerPosition
	next func() ([]byte, []byte, int64, error)
	buf  []byte
}

// offset is the input offset after the last record the parser returned.
func (r *readerReader) offset() int64 {
	src := r.src
	if src.cfg.format == FormatCSV {
		if src.csvReader == nil {
			return r.pos.Offset
		}
		return r.s.base.Load() + int64(src.bomDropped()) + src.csvReader.InputOffset()
	}
	if src.br == nil {
		return r.pos.Offset
	}
	return r.s.base.Load() + src.r.n.Load() - int64(src.br.Buffered()) - int64(src.bomHeld())
}

func (r *readerReader) Read(ctx context.Context, buf []SourceRecord) (n int, err error) {
	if r.pos.Done || r.s.failure() != nil {
		return 0, io.EOF
	}
	defer func() {
		// A bug in reading the input (or a panicking Input reader) fails this run with an
		// error; it must not take down the process and every other pipeline in it.
		if p := recover(); p != nil {
			perr := fmt.Errorf("pipeline: internal error reading input (please report it): %v", p)
			r.s.failed.Store(&perr)
			n, err = 0, io.EOF
		}
	}()
	return r.read(buf)
}

func (r *readerReader) read(buf []SourceRecord) (int, error) {
	src := r.src
	n := 0
	r.buf = r.buf[:0]
	for n < len(buf) {
		value, raw, line, err := r.next()
		if err == io.EOF {
			r.pos.Done = true
			break
		}
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			// The input was cancelled (the run is being stopped): not a read error that ends
			// the input with a final checkpoint. The records read so far go out; the next
			// call fails the source, and with it the attempt, without a checkpoint.
			if n > 0 {
				break
			}
			return 0, err
		}
		if err == nil {
			var rec SourceRecord
			if rec, err = r.record(value, line); err == nil {
				r.pos.Offset, r.pos.Line, r.pos.Header = r.offset(), src.line, src.csvHeader
				// Key and value alias the parser's buffer, which the next line overwrites:
				// copied, and placed below once r.buf no longer grows.
				rec.Key, rec.Value = rec.Key[:len(rec.Key):len(rec.Key)], value
				r.buf = append(append(r.buf, rec.Key...), value...)
				buf[n] = rec
				n++
				r.s.recs.Add(1)
				continue
			}
			var me *MalformedError
			if !errors.As(err, &me) {
				err = &MalformedError{Line: line, Err: err}
			}
		}
		var me *MalformedError
		if errors.As(err, &me) {
			err = src.malformed(me, raw)
			if err == nil {
				r.s.skipped.Add(1)
				r.pos.Offset, r.pos.Line, r.pos.Header = r.offset(), src.line, src.csvHeader
				continue
			}
		}
		r.s.failed.Store(&err)
		break
	}
	off := 0
	for i := range n {
		if k := len(buf[i].Key); buf[i].Key != nil {
			buf[i].Key = r.buf[off : off+k : off+k]
			off += k
		}
		l := len(buf[i].Value)
		buf[i].Value = r.buf[off : off+l : off+l]
		off += l
	}
	if n > 0 {
		return n, nil
	}
	if r.pos.Done || r.s.failure() != nil {
		return 0, io.EOF
	}
	return 0, nil
}

// record checks a parsed record's size, key and event time, as the flag form always did: a
// record that fails them is malformed.
func (r *readerReader) record(value []byte, line int64) (SourceRecord, error) {
	cfg := &r.src.cfg
	rec := SourceRecord{Pos: line}
	if len(value) > cfg.maxValue {
		return rec, fmt.Errorf("record of %d bytes exceeds the %d-byte limit", len(value), cfg.maxValue)
	}
	if cfg.keyField != "" {
		raw, ok := topLevelField(value, cfg.keyField)
		if !ok {
			return rec, fmt.Errorf("no %q field to key by", cfg.keyField)
		}
		k, err := keyText(raw)
		if err != nil {
			return rec, fmt.Errorf("field %q: %w", cfg.keyField, err)
		}
		if len(k) > cfg.maxKey {
			return rec, fmt.Errorf("key of %d bytes exceeds the %d-byte limit", len(k), cfg.maxKey)
		}
		rec.Key = k
	}
	if cfg.timeField != "" {
		raw, ok := topLevelField(value, cfg.timeField)
		if !ok {
			return rec, fmt.Errorf("no %q field for the event time", cfg.timeField)
		}
		ts, err := parseTime(raw)
		if err != nil {
			return rec, fmt.Errorf("field %q: %w", cfg.timeField, err)
		}
		rec.TS, rec.HasTS = ts, true
	}
	return rec, nil
}

func (r *readerReader) Positions() []Split {
	b, _ := json.Marshal(r.pos)
	return []Split{{ID: r.s.split, Position: b}}
}

func (r *readerReader) Close() error { return nil }

// --- the sink ---

// writerSink writes the operator's output as JSON Lines to Options.Output. With file set (a
// regular file the caller names), it is exactly once: the output is fsynced on each barrier
// and its length is the checkpoint's handle; Recover truncates it to the restored checkpoint's
// length (to nothing for a fresh start).
type writerSink struct {
	w        io.Writer
	file     *os.File
	name     string
	operator string

	records atomic.Int64
	end     int64 // the file's length when the writer opens
}

type writerHandle struct {
	Output string `json:"output"`
	End    int64  `json:"end"`
}

func (s *writerSink) Committer() SinkCommitter {
	if s.file == nil {
		return nil
	}
	return s
}

func (s *writerSink) Open(ctx context.Context, sc SinkContext) (SinkWriter, error) {
	return &writerSinkWriter{s: s, bw: bufio.NewWriterSize(s.w, 256<<10), off: s.end}, nil
}

func (s *writerSink) Prepare(ctx context.Context, checkpoint uint64, handles [][]byte) ([]byte, error) {
	if len(handles) != 1 {
		return nil, fmt.Errorf("the flag form's output has one subtask, not %d", len(handles))
	}
	return handles[0], nil
}

// Commit implements SinkCommitter: the output was made durable by PreCommit, and a restore
// truncates whatever no committed checkpoint covers.
func (s *writerSink) Commit(ctx context.Context, checkpoint uint64, prepared []byte) error {
	return nil
}

func (s *writerSink) Recover(ctx context.Context, checkpoint uint64, prepared []byte) error {
	var h writerHandle
	if prepared != nil {
		if err := json.Unmarshal(prepared, &h); err != nil {
			return fmt.Errorf("output: bad checkpoint handle %q: %w", prepared, err)
		}
	}
	end := int64(0)
	if h.Output == s.name {
		end = h.End // the same output: keep what the checkpoint committed
	}
	st, err := s.file.Stat()
	if err != nil {
		return fmt.Errorf("output %s: %w", s.name, err)
	}
	if st.Size() < end {
		return fmt.Errorf("output %s is %d bytes, shorter than the %d bytes checkpoint %d committed: it changed since", s.name, st.Size(), end, checkpoint)
	}
	if err := s.file.Truncate(end); err != nil {
		return fmt.Errorf("output %s: discarding what checkpoint %d did not commit: %w", s.name, checkpoint, err)
	}
	if _, err := s.file.Seek(end, io.SeekStart); err != nil {
		return fmt.Errorf("output %s: %w", s.name, err)
	}
	s.end = end
	return nil
}

type writerSinkWriter struct {
	s       *writerSink
	bw      *bufio.Writer
	off     int64
	compact bytes.Buffer
}

func (w *writerSinkWriter) Write(ctx context.Context, recs []SinkRecord) error {
	for i := range recs {
		r := &recs[i]
		v := r.Value
		if !json.Valid(v) {
			return &OutputError{Operator: w.s.operator, Where: (*flagForm)(nil).describe(r.Pos), Key: bytes.Clone(r.Key), Err: invalidJSON(v)}
		}
		if bytes.ContainsAny(v, "\r\n") {
			w.compact.Reset()
			_ = json.Compact(&w.compact, v)
			v = w.compact.Bytes()
		}
		w.bw.Write(v)
		if err := w.bw.WriteByte('\n'); err != nil {
			return fmt.Errorf("writing output: %w", err)
		}
		w.off += int64(len(v) + 1)
		w.s.records.Add(1)
	}
	return nil
}

func (w *writerSinkWriter) PreCommit(ctx context.Context, checkpoint uint64) ([]byte, error) {
	if err := w.bw.Flush(); err != nil {
		return nil, fmt.Errorf("writing output: %w", err)
	}
	if w.s.file != nil {
		if err := w.s.file.Sync(); err != nil {
			return nil, fmt.Errorf("output %s: fsync: %w", w.s.name, err)
		}
	}
	return json.Marshal(writerHandle{Output: w.s.name, End: w.off})
}

func (w *writerSinkWriter) Close(ctx context.Context) error {
	if err := w.bw.Flush(); err != nil {
		return fmt.Errorf("writing output: %w", err)
	}
	return nil
}

// --- the dead letters of guest faults ---

// lineWriter shares the dead-letter output between the source (malformed lines) and the
// dead-letter sink (records whose guest call faulted): each holds it for whole lines, so that
// the two never interleave within one. The source writes an oversized line in several Writes,
// the last ending in '\n'; it holds the lock from its first Write to that one (or to a failed
// Write, after which its line is abandoned).
type lineWriter struct {
	mu   sync.Mutex
	w    io.Writer
	held bool // by the source, between the Writes of one line; only the source touches it
}

// Write is the source's: lines, possibly in several parts.
func (l *lineWriter) Write(p []byte) (int, error) {
	if !l.held {
		l.mu.Lock()
		l.held = true
	}
	n, err := l.w.Write(p)
	if err != nil || (len(p) > 0 && p[len(p)-1] == '\n') {
		l.held = false
		l.mu.Unlock()
	}
	return n, err
}

// writeLine is the sink's: one whole line.
func (l *lineWriter) writeLine(p []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := l.w.Write(p)
	return err
}

// deadLetterSink writes the operator's NAME.errors side output to the dead-letter output, in
// the flag form's terms: the input line, and the module's name as the operator. At least once,
// as the malformed lines are: a restore writes again the dead letters after its checkpoint.
type deadLetterSink struct {
	w        *lineWriter
	operator string
	records  atomic.Int64
}

func (s *deadLetterSink) Committer() SinkCommitter { return nil }
func (s *deadLetterSink) Open(context.Context, SinkContext) (SinkWriter, error) {
	return s, nil
}

func (s *deadLetterSink) Write(_ context.Context, recs []SinkRecord) error {
	for i := range recs {
		var in struct {
			Key       string  `json:"key"`
			Attempts  int     `json:"attempts"`
			Reason    string  `json:"reason"`
			Raw       *string `json:"raw,omitempty"`
			RawBase64 *string `json:"raw_base64,omitempty"`
		}
		if err := json.Unmarshal(recs[i].Value, &in); err != nil {
			return fmt.Errorf("dead-letter output: a dead letter that is not JSON: %w", err)
		}
		out := struct {
			Line      int64   `json:"line"`
			Operator  string  `json:"operator"`
			Key       string  `json:"key"`
			Attempts  int     `json:"attempts"`
			Reason    string  `json:"reason"`
			Raw       *string `json:"raw,omitempty"`
			RawBase64 *string `json:"raw_base64,omitempty"`
		}{recs[i].Pos, s.operator, in.Key, in.Attempts, in.Reason, in.Raw, in.RawBase64}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(&out) // strings and integers
		if err := s.w.writeLine(buf.Bytes()); err != nil {
			return fmt.Errorf("dead-letter output: %w", err)
		}
		s.records.Add(1)
	}
	return nil
}

func (s *deadLetterSink) PreCommit(context.Context, uint64) ([]byte, error) { return nil, nil }
func (s *deadLetterSink) Close(context.Context) error                       { return nil }

// --- Run ---

// Run executes the flag form to the end of its input: a one-operator spec through the
// runtime. On failure the returned Summary still describes what was done.
func Run(ctx context.Context, opts Options) (*Summary, error) {
	start := time.Now()
	sum := &Summary{}
	if opts.Output == nil || opts.Input == nil {
		return sum, errors.New("pipeline: Input and Output are required")
	}
	if opts.Format == "" {
		opts.Format = FormatJSONL
	}
	if opts.OnMalformed == "" {
		opts.OnMalformed = MalformedFail
	}
	opts.OnError = cmp.Or(opts.OnError, "fail")
	if err := opts.validate(); err != nil {
		return sum, err
	}
	var dead *lineWriter
	if opts.OnError == "dead-letter" {
		dead = &lineWriter{w: opts.DeadLetter}
		opts.DeadLetter = dead // the source's malformed lines share it
	}
	engOpts := []abi.EngineOption{abi.WithLimits(opts.Limits)}
	if opts.CacheDir != "" {
		engOpts = append(engOpts, abi.WithCompilationCacheDir(opts.CacheDir))
	}
	eng, err := abi.NewEngine(ctx, engOpts...)
	if err != nil {
		return sum, err
	}
	defer eng.Close(context.WithoutCancel(ctx))
	mod, err := eng.Load(ctx, opts.Module, abi.WithEndpoints(EndpointNames(opts.Endpoints)...))
	if err != nil {
		return sum, err
	}
	if opts.Order != scheduler.OrderPerKey && len(mod.Manifest.States) > 0 {
		return sum, fmt.Errorf("%w: operator %q declares keyed state (%s), which needs per-key order: output order %s runs the records of a key concurrently; use order key",
			ErrOrderWithState, mod.Name(), strings.Join(mod.Manifest.States, ", "), orderFlagName(opts.Order))
	}
	sum.Operator = mod.Name()
	job := cmp.Or(opts.Job, mod.Name())
	if !nameRE.MatchString(job) {
		return sum, fmt.Errorf("the job name %q must be 1-64 characters of [A-Za-z0-9_-] (name it with --job)", job)
	}
	// The operator's name in the spec is fixed, so that an upgrade to a module of another
	// name restores the same state (the job names it).
	const opName = "operator"
	self := IdentifyModule(opts.Module, mod.Name(), mod.Manifest.States)

	// The state pool: the user's, or process memory (no checkpoint outlives the run).
	stateURL := opts.StateURL
	if stateURL == "" {
		if opts.Restore != 0 && opts.Restore != RestoreLatestIfAny {
			return sum, &NoCheckpointError{Job: job, Pool: "process memory (no state pool)", Want: opts.Restore}
		}
		stateURL = "mem://"
	}
	pool := redactURL(stateURL)
	// The pool's background failures (compaction, garbage collection) are warnings on the log.
	stOpts := []state.Option{state.WithRetainCheckpoints(DefaultCheckpointRetain + 4), state.WithLogger(lookupLogger(opts.Log))}
	if opts.HotBytes > 0 {
		stOpts = append(stOpts, state.WithHotBytes(opts.HotBytes))
	}
	store, err := state.Open(ctx, stateURL, stOpts...)
	if err != nil {
		return sum, fmt.Errorf("state pool %s: %w", pool, redactErr(err, stateURL))
	}
	defer store.Close()

	// Reach the pool's checkpoint records now, so that an unreachable pool fails before
	// anything runs, naming the pool.
	rs, err := openJobRecords(store, stateURL, "", job)
	if err != nil {
		return sum, fmt.Errorf("state pool %s: %w", pool, redactErr(err, stateURL))
	}
	if _, err := rs.List(ctx, kindCommitted); err != nil {
		return sum, fmt.Errorf("state pool %s: listing checkpoints: %w", pool, redactErr(err, stateURL))
	}
	reg := opts.Registry
	if reg == nil {
		reg = lookup.NewRegistry(lookup.WithLogger(lookupLogger(opts.Log)))
	}
	if len(opts.Endpoints) > 0 { // the endpoints' errors, before anything runs
		_, closeEndpoints, err := openLookups(reg, "", opts.Endpoints, mod.Manifest.Endpoints)
		if err != nil {
			return sum, err
		}
		closeEndpoints()
	}

	// Resolve the restore here, to report it as the flag form always did.
	restore := "none"
	if opts.Restore != 0 {
		info, id, err := flagRestore(ctx, opts, rs, stateURL, job, opName, self, mod.Manifest)
		if err != nil {
			return sum, err
		}
		sum.Restored = info
		if id != 0 {
			restore = strconv.FormatUint(id, 10)
		}
	}

	interval := Duration(cmp.Or(opts.CheckpointEvery, DefaultCheckpointInterval))
	if opts.CheckpointEvery < 0 {
		interval = 0
	}
	final := false // the newest checkpoints are kept, as ever; no savepoint piles up per run
	srcSpec := SourceSpec{Name: flagSourceName, Type: "flag-input", OnMalformed: opts.OnMalformed}
	if opts.TimeField != "" {
		srcSpec.EventTime = &EventTimeSpec{MaxOutOfOrderness: Duration(opts.WatermarkDelay), WatermarkEvery: cmp.Or(opts.WatermarkEvery, DefaultWatermarkEvery)}
	}
	opSpec := OperatorSpec{Name: opName, Module: "flag-form", Inputs: []string{flagSourceName}, Endpoints: opts.Endpoints,
		Order:  map[scheduler.Order]string{scheduler.OrderPerKey: "per-key", scheduler.OrderInput: "input", scheduler.OrderNone: "none"}[opts.Order],
		Limits: LimitsSpec{MaxInFlight: opts.MaxInFlight}, Late: "drop", OnError: opts.OnError, Retries: opts.Retries}
	switch {
	case opts.Order != scheduler.OrderPerKey:
	case opts.KeyField != "":
		opSpec.Key = &KeySpec{Source: true}
	case mod.HasKey():
		opSpec.Key = &KeySpec{Guest: true}
	}
	spec := &Spec{Name: job, Mode: ModeBounded, Checkpoints: CheckpointSpec{Interval: &interval, FinalSavepoint: &final},
		Sources: []SourceSpec{srcSpec}, Operators: []OperatorSpec{opSpec},
		Sinks: []SinkSpec{{Name: flagSinkName, Type: "flag-output", Inputs: []string{opName}}}}
	var deadSink *deadLetterSink
	if dead != nil {
		deadSink = &deadLetterSink{w: dead, operator: mod.Name()}
		spec.Sinks = append(spec.Sinks, SinkSpec{Name: flagDeadLetterName, Type: "flag-dead-letter", Inputs: []string{opName + ".errors"}})
	}

	lim := eng.Limits()
	src := &readerSource{opts: &opts, split: cmp.Or(opts.InputName, "input"),
		maxKey: lim.MaxRecordKey, maxValue: lim.MaxRecordValue}
	sink := &writerSink{w: opts.Output, operator: mod.Name(), name: opts.OutputName}
	if f, ok := opts.Output.(*os.File); ok && opts.OutputName != "" {
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
			sink.file = f
		}
	}
	conns := &Connectors{}
	conns.RegisterSource("flag-input", func(*SourceSpec, *ConnectorOptions, *Env) (Source, error) { return src, nil })
	conns.RegisterSink("flag-output", func(*SinkSpec, *ConnectorOptions, *Env) (Sink, error) { return sink, nil })
	if deadSink != nil {
		conns.RegisterSink("flag-dead-letter", func(*SinkSpec, *ConnectorOptions, *Env) (Sink, error) { return deadSink, nil })
	}
	hooks := &flagForm{bin: opts.Module, eng: eng, mod: mod, record: opts.Record}
	env := Env{Connectors: conns, StateURL: stateURL, Store: store, Restore: restore, Lookups: reg, CacheDir: opts.CacheDir,
		GuestLog: opts.Log, OnCommitPhase: opts.OnCommitPhase, flag: hooks}
	if rec := opts.Record; rec != nil {
		origin := replay.StateOriginEmpty
		if sum.Restored != nil && sum.Restored.Checkpoint != 0 {
			origin = fmt.Sprintf("checkpoint %d", sum.Restored.Checkpoint)
		}
		if err := rec.Begin(replay.RunInfo{
			Operator: mod.Name(), ModuleSHA256: self.SHA256, States: mod.Manifest.States, Order: opts.Order,
			KeyField: opts.KeyField, TimeField: opts.TimeField, StateOrigin: origin, Limits: lim,
			Declared: mod.Manifest.Endpoints, Endpoints: opts.Endpoints,
		}); err != nil {
			return sum, err
		}
	}
	sum.Resumable = opts.StateURL != "" && !strings.HasPrefix(stateURL, "mem:")

	j, err := Start(ctx, spec, env)
	if err != nil {
		return sum, err
	}
	progressDone := make(chan struct{})
	var progressWG sync.WaitGroup
	if opts.Progress != nil {
		progressWG.Add(1)
		go func() {
			defer progressWG.Done()
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-progressDone:
					return
				case <-t.C:
					opts.Progress(Progress{BytesRead: src.bytesRead(), InputSize: opts.InputSize,
						RecordsIn: src.recs.Load(), Outputs: sink.records.Load(), Elapsed: time.Since(start)})
				}
			}
		}()
	}
	var runErr error
	select {
	case <-j.Done():
		_, runErr = j.Wait()
	case <-ctx.Done():
		// Cancelled (SIGINT/SIGTERM): stop at once; the committed output ends at the last
		// checkpoint, which the summary names.
		j.Stop(context.WithoutCancel(ctx), false)
		_, runErr = j.Wait()
		if runErr == nil {
			runErr = context.Cause(ctx)
		}
	}
	close(progressDone)
	progressWG.Wait()

	hooks.mu.Lock()
	sum.Scheduler, sum.MaxInFlight, sum.State, sum.Lookups = hooks.sched, hooks.maxInFlight, hooks.stateM, hooks.lookups
	if hooks.migration != nil && sum.Restored != nil {
		sum.Restored.Migration = hooks.migration
	}
	if opts.StateURL != "" {
		sum.Checkpoints, sum.CheckpointBytes = slices.Clone(hooks.checkpoints), hooks.ckptBytes
		if l := hooks.last; l != nil {
			sum.Position = describeFlagPosition(l.Positions[flagSourceName])
		}
	} else {
		sum.State = nil
	}
	hooks.mu.Unlock()
	sum.RecordsIn = src.recs.Load()
	sum.Skipped = src.skipped.Load()
	sum.RecordsOut = sink.records.Load()
	if deadSink != nil {
		sum.DeadLetters = deadSink.records.Load()
	}
	sum.Duration = time.Since(start)
	if runErr == nil {
		runErr = src.failure()
	}
	if runErr == nil && opts.Record != nil {
		runErr = opts.Record.Err()
	}
	return sum, redactErr(unwrapFlagError(runErr), stateURL)
}

// unwrapFlagError drops the runtime's subtask names ("sink output[0]: ") from an error: the
// flag form has one input, one operator and one output, and its messages name the line.
func unwrapFlagError(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, p := range []string{"source " + flagSourceName + "[0]: ", "sink " + flagSinkName + "[0]: ", "sink " + flagDeadLetterName + "[0]: "} {
		if m, ok := strings.CutPrefix(msg, p); ok {
			return &redactedError{msg: m, err: err}
		}
	}
	return err
}

// describeFlagPosition says where the input stands at a checkpoint.
func describeFlagPosition(splits []Split) string {
	for _, sp := range splits {
		var p readerPosition
		if json.Unmarshal(sp.Position, &p) != nil {
			continue
		}
		if p.Done {
			return "the end of the input"
		}
		return fmt.Sprintf("input line %d (byte %d)", p.Line, p.Offset)
	}
	return "the start of the input"
}

// flagRestore finds the checkpoint the flag form restores and checks that its module may
// restore it. It returns 0 for latest-if-any when there is none.
func flagRestore(ctx context.Context, opts Options, rs recordStore, stateURL, job, opName string, self ModuleIdentity, man abi.Manifest) (*RestoreInfo, uint64, error) {
	pool := redactURL(stateURL)
	ids, err := rs.List(ctx, kindCommitted)
	if err != nil {
		return nil, 0, fmt.Errorf("state pool %s: listing checkpoints: %w", pool, redactErr(err, stateURL))
	}
	newestFirst := slices.Clone(ids)
	slices.Reverse(newestFirst)
	from := opts.Restore
	switch {
	case (from == state.RestoreLatest || from == RestoreLatestIfAny) && len(ids) > 0:
		from = ids[len(ids)-1]
	case from == RestoreLatestIfAny:
		return &RestoreInfo{}, 0, nil
	case from == state.RestoreLatest || !slices.Contains(ids, from):
		return nil, 0, &NoCheckpointError{Job: job, Pool: pool, Want: from, Existing: newestFirst}
	}
	rec, err := rs.Get(ctx, kindCommitted, from)
	if err != nil {
		return nil, 0, fmt.Errorf("restoring %s from %s: %w", job, pool, err)
	}
	info := &RestoreInfo{Checkpoint: from, Into: self}
	oc := rec.Operators[opName]
	if oc == nil {
		return nil, 0, fmt.Errorf("%w: checkpoint %d of job %q in %s holds no operator %s (it holds %s): name the job that belongs to this module with --job, or start empty without --restore",
			ErrModuleMismatch, from, job, pool, opName, strings.Join(slices.Sorted(maps.Keys(rec.Operators)), ", "))
	}
	prev, _ := json.Marshal(ModuleIdentity{SHA256: oc.ModuleSHA256, Name: oc.Module, States: oc.States})
	if err := checkModule(info, prev, self, job, pool); err != nil {
		return nil, 0, err
	}
	if err := checkStateVersion(opName, from, oc, man); err != nil {
		return nil, 0, err
	}
	if oc.StateVersion != man.StateVersion {
		info.Migrated, info.FromVersion, info.ToVersion = true, oc.StateVersion, man.StateVersion
	}
	return info, from, nil
}
