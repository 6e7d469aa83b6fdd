package pipeline

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/host/scheduler"
)

// Format is an input format.
type Format string

const (
	FormatJSONL Format = "jsonl"
	FormatCSV   Format = "csv"
)

// MalformedPolicy says what to do with an input record that cannot be parsed or keyed.
type MalformedPolicy string

const (
	// MalformedFail stops the pipeline with an error naming the line (the default).
	MalformedFail MalformedPolicy = "fail"
	// MalformedSkip writes the line to the dead-letter output and goes on.
	MalformedSkip MalformedPolicy = "skip"
)

// MalformedError reports an input record the source could not use.
type MalformedError struct {
	Line int64
	Err  error
}

func (e *MalformedError) Error() string { return fmt.Sprintf("input line %d: %v", e.Line, e.Err) }
func (e *MalformedError) Unwrap() error { return e.Err }

// sourceConfig is what the reader needs from Options.
type sourceConfig struct {
	format         Format
	keyField       string // "" with keyByModule: the guest keys records
	keyByModule    bool
	timeField      string
	watermarkDelay time.Duration
	watermarkEvery int
	policy         MalformedPolicy
	deadLetter     io.Writer
	maxKey         int
	maxValue       int
	batch          int
}

// source turns an input stream into scheduler elements: records keyed and timestamped, with
// periodic bounded-out-of-orderness watermarks, and a final watermark at +inf so every timer
// fires at the end of a bounded input.
type source struct {
	cfg       sourceConfig
	r         *countingReader
	line      int64
	recs      atomic.Int64
	skipped   atomic.Int64
	maxTS     int64
	wm        int64
	sinceWM   int
	csvHeader []string
	br        *bufio.Reader

	// Checkpoints: a barrier every checkpointEvery (if > 0), with ids from nextCheckpoint.
	checkpointEvery time.Duration
	nextCheckpoint  uint64
	lastCheckpoint  time.Time
	arena           []byte
}

type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func newSource(cfg sourceConfig, r io.Reader) *source {
	if cfg.batch <= 0 {
		cfg.batch = 256
	}
	if cfg.watermarkEvery <= 0 {
		cfg.watermarkEvery = 1000
	}
	return &source{cfg: cfg, r: &countingReader{r: r}, maxTS: math.MinInt64, wm: math.MinInt64}
}

// run reads everything and sends batches to out, closing it at the end. It stops early, with an
// error, on a malformed record under MalformedFail, on a read error, or when stop is closed.
func (s *source) run(out chan<- []scheduler.Element, stop <-chan struct{}) error {
	defer close(out)
	batch := make([]scheduler.Element, 0, s.cfg.batch)
	send := func() bool {
		if len(batch) == 0 {
			return true
		}
		select {
		case out <- batch:
			batch = make([]scheduler.Element, 0, s.cfg.batch)
			return true
		case <-stop:
			return false
		}
	}
	emit := func(el scheduler.Element) bool {
		batch = append(batch, el)
		if len(batch) == cap(batch) {
			return send()
		}
		return true
	}
	next := s.jsonLines
	if s.cfg.format == FormatCSV {
		next = s.csvRecords()
	}
	for {
		value, line, err := next()
		if err == io.EOF {
			break
		}
		if err != nil {
			var me *MalformedError
			if errors.As(err, &me) {
				if serr := s.malformed(me, value); serr != nil {
					send() // the records before the bad line are still processed
					return serr
				}
				continue
			}
			send()
			return err
		}
		el, err := s.record(value, line)
		if err != nil {
			if serr := s.malformed(&MalformedError{Line: line, Err: err}, value); serr != nil {
				send()
				return serr
			}
			continue
		}
		s.recs.Add(1)
		if !emit(el) {
			return nil
		}
		if s.checkpointEvery > 0 && s.recs.Load()%64 == 0 && time.Since(s.lastCheckpoint) >= s.checkpointEvery {
			if !s.lastCheckpoint.IsZero() {
				if !emit(scheduler.Element{Kind: scheduler.ElementBarrier, CheckID: s.nextCheckpoint}) {
					return nil
				}
				s.nextCheckpoint++
			}
			s.lastCheckpoint = time.Now()
		}
		if wm, ok := s.watermark(); ok {
			if !emit(scheduler.Element{Kind: scheduler.ElementWatermark, TS: wm}) {
				return nil
			}
		}
	}
	if !emit(scheduler.Element{Kind: scheduler.ElementWatermark, TS: math.MaxInt64}) {
		return nil
	}
	send()
	return nil
}

func (s *source) malformed(me *MalformedError, raw []byte) error {
	if s.cfg.policy != MalformedSkip {
		return me
	}
	s.skipped.Add(1)
	if s.cfg.deadLetter != nil {
		b, _ := json.Marshal(struct {
			Line  int64  `json:"line"`
			Error string `json:"error"`
			Raw   string `json:"raw"`
		}{me.Line, me.Err.Error(), string(raw)})
		if _, err := s.cfg.deadLetter.Write(append(b, '\n')); err != nil {
			return fmt.Errorf("dead-letter output: %w", err)
		}
	}
	return nil
}

// copyBytes copies b into the source's arena. Elements alias arenas that are never reused: the
// controller may hold a record's key and value for as long as the record is in flight.
func (s *source) copyBytes(b []byte) []byte {
	if len(b) > cap(s.arena)-len(s.arena) {
		s.arena = make([]byte, 0, max(64<<10, len(b)))
	}
	start := len(s.arena)
	s.arena = append(s.arena, b...)
	return s.arena[start:len(s.arena):len(s.arena)]
}

func (s *source) record(value []byte, line int64) (scheduler.Element, error) {
	if len(value) > s.cfg.maxValue {
		return scheduler.Element{}, fmt.Errorf("record of %d bytes exceeds the %d-byte limit", len(value), s.cfg.maxValue)
	}
	el := scheduler.Element{Kind: scheduler.ElementRecord, Pos: line}
	switch {
	case s.cfg.keyField != "":
		raw, ok := topLevelField(value, s.cfg.keyField)
		if !ok {
			return el, fmt.Errorf("no %q field to key by", s.cfg.keyField)
		}
		k, err := keyText(raw)
		if err != nil {
			return el, fmt.Errorf("field %q: %v", s.cfg.keyField, err)
		}
		if len(k) > s.cfg.maxKey {
			return el, fmt.Errorf("key of %d bytes exceeds the %d-byte limit", len(k), s.cfg.maxKey)
		}
		el.Key = k
	case s.cfg.keyByModule:
		el.KeyByWasm = true
	}
	if s.cfg.timeField != "" {
		raw, ok := topLevelField(value, s.cfg.timeField)
		if !ok {
			return el, fmt.Errorf("no %q field for the event time", s.cfg.timeField)
		}
		ts, err := parseTime(raw)
		if err != nil {
			return el, fmt.Errorf("field %q: %v", s.cfg.timeField, err)
		}
		el.TS = ts
		s.maxTS = max(s.maxTS, ts)
	} else {
		el.TS = time.Now().UnixMilli() // ingestion time
	}
	// One arena copy for key and value.
	kv := s.copyBytes(append(append(make([]byte, 0, len(el.Key)+len(value)), el.Key...), value...))
	el.Key, el.Value = kv[:len(el.Key):len(el.Key)], kv[len(el.Key):]
	return el, nil
}

// watermark emits a bounded-out-of-orderness watermark every watermarkEvery records when event
// time advanced.
func (s *source) watermark() (int64, bool) {
	if s.cfg.timeField == "" {
		return 0, false
	}
	s.sinceWM++
	if s.sinceWM < s.cfg.watermarkEvery || s.maxTS == math.MinInt64 {
		return 0, false
	}
	s.sinceWM = 0
	wm := s.maxTS - s.cfg.watermarkDelay.Milliseconds()
	if wm <= s.wm {
		return 0, false
	}
	s.wm = wm
	return wm, true
}

func (s *source) jsonLinesReader() *bufio.Reader { return bufio.NewReaderSize(s.r, 256<<10) }

// jsonLines returns the next non-empty line as a record value.
func (s *source) jsonLines() ([]byte, int64, error) {
	if s.br == nil {
		s.br = s.jsonLinesReader()
	}
	for {
		line, err := s.br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A line longer than the buffer: gather it.
			long := bytes.Clone(line)
			for err == bufio.ErrBufferFull {
				line, err = s.br.ReadSlice('\n')
				long = append(long, line...)
				if len(long) > s.cfg.maxValue+1 {
					// Skip the rest of the line without holding it.
					for err == bufio.ErrBufferFull {
						_, err = s.br.ReadSlice('\n')
					}
					s.line++
					return long[:256], s.line, &MalformedError{Line: s.line, Err: fmt.Errorf("line exceeds the %d-byte record limit", s.cfg.maxValue)}
				}
			}
			line = long
		}
		if len(line) == 0 && err != nil {
			if err == io.EOF {
				return nil, 0, io.EOF
			}
			return nil, 0, fmt.Errorf("reading input: %w", err)
		}
		if err != nil && err != io.EOF {
			return nil, 0, fmt.Errorf("reading input: %w", err)
		}
		s.line++
		line = bytes.TrimRight(line, "\r\n")
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if !json.Valid(line) {
			return line, s.line, &MalformedError{Line: s.line, Err: jsonSyntaxError(line)}
		}
		if t := bytes.TrimSpace(line); t[0] != '{' {
			return line, s.line, &MalformedError{Line: s.line, Err: errors.New("a record must be a JSON object")}
		}
		return line, s.line, nil
	}
}

func jsonSyntaxError(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("invalid JSON: %v", err)
	}
	return errors.New("invalid JSON")
}

// csvRecords reads CSV with a header row and turns each row into a JSON object. A cell that is a
// valid JSON number becomes a number; everything else stays a string.
func (s *source) csvRecords() func() ([]byte, int64, error) {
	cr := csv.NewReader(s.r)
	cr.ReuseRecord = true
	cr.FieldsPerRecord = 0
	var buf []byte
	return func() ([]byte, int64, error) {
		for {
			row, err := cr.Read()
			line, _ := cr.FieldPos(0)
			if err == io.EOF {
				return nil, 0, io.EOF
			}
			if err != nil {
				var pe *csv.ParseError
				if errors.As(err, &pe) {
					return nil, int64(pe.StartLine), &MalformedError{Line: int64(pe.StartLine), Err: pe.Err}
				}
				return nil, 0, fmt.Errorf("reading input: %w", err)
			}
			if s.csvHeader == nil {
				s.csvHeader = append([]string(nil), row...)
				continue
			}
			buf = append(buf[:0], '{')
			for i, h := range s.csvHeader {
				if i > 0 {
					buf = append(buf, ',')
				}
				hb, _ := json.Marshal(h)
				buf = append(buf, hb...)
				buf = append(buf, ':')
				if isJSONNumber(row[i]) {
					buf = append(buf, row[i]...)
				} else {
					kb, _ := json.Marshal(row[i])
					buf = append(buf, kb...)
				}
			}
			buf = append(buf, '}')
			return buf, int64(line), nil
		}
	}
}

func isJSONNumber(s string) bool {
	if s == "" {
		return false
	}
	var n json.Number
	return json.Unmarshal([]byte(s), &n) == nil && s[0] != '+' && s != "-"
}
