package pipeline

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/internal/jsonfield"
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

	streamed bool // the record already went to the dead-letter output (an oversize line)
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
	r         *countingReader // counts the input's bytes, for progress
	in        io.Reader       // r without a leading byte order mark
	line      int64
	recs      atomic.Int64
	skipped   atomic.Int64
	maxTS     int64
	wm        int64
	sinceWM   int
	csvHeader []string
	br        *bufio.Reader
	csvReader *csv.Reader
	// lineBase is the line the reading started after (a restore's); CSV line numbers count
	// from the reader's start.
	lineBase int64

	// Checkpoints: a barrier every checkpointEvery (if > 0), with ids from nextCheckpoint.
	checkpointEvery time.Duration
	nextCheckpoint  uint64
	lastCheckpoint  time.Time
	arena           []byte

	// tap, if set, sees every batch before it is sent (a recording, host/replay); its error
	// stops the source, which returns it.
	tap    func([]scheduler.Element) error
	tapErr error
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
	s := &source{cfg: cfg, r: &countingReader{r: r}, maxTS: math.MinInt64, wm: math.MinInt64}
	s.in = &bomSkipper{r: s.r}
	return s
}

// utf8BOM is the byte order mark some editors put at the start of a UTF-8 file.
var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// bomSkipper drops a UTF-8 byte order mark at the start of its input.
type bomSkipper struct {
	r       io.Reader
	checked bool
	head    []byte // bytes read while checking, not yet returned
	dropped int    // 3 once a BOM was dropped
}

// bomDropped is the length of the byte order mark dropped from the input (0 or 3).
func (s *source) bomDropped() int {
	if b, ok := s.in.(*bomSkipper); ok {
		return b.dropped
	}
	return 0
}

// bomHeld is the number of input bytes the BOM check read and has not passed on yet.
func (s *source) bomHeld() int {
	if b, ok := s.in.(*bomSkipper); ok {
		return len(b.head)
	}
	return 0
}

func (b *bomSkipper) Read(p []byte) (int, error) {
	if !b.checked {
		b.checked = true
		var h [3]byte
		n, err := io.ReadFull(b.r, h[:])
		if n == 3 && bytes.Equal(h[:], utf8BOM) {
			n, b.dropped = 0, 3
		}
		b.head = h[:n]
		if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
			return 0, err
		}
	}
	if len(b.head) > 0 {
		n := copy(p, b.head)
		b.head = b.head[n:]
		return n, nil
	}
	return b.r.Read(p)
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
		if s.tap != nil && s.tapErr == nil {
			if s.tapErr = s.tap(batch); s.tapErr != nil {
				return false
			}
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
		value, raw, line, err := next()
		if err == io.EOF {
			break
		}
		if err != nil {
			var me *MalformedError
			if errors.As(err, &me) {
				if serr := s.malformed(me, raw); serr != nil {
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
			if serr := s.malformed(&MalformedError{Line: line, Err: err}, raw); serr != nil {
				send()
				return serr
			}
			continue
		}
		s.recs.Add(1)
		if !emit(el) {
			return s.tapErr
		}
		if s.checkpointEvery > 0 && s.recs.Load()%64 == 0 && time.Since(s.lastCheckpoint) >= s.checkpointEvery {
			if !s.lastCheckpoint.IsZero() {
				if !emit(scheduler.Element{Kind: scheduler.ElementBarrier, CheckID: s.nextCheckpoint}) {
					return s.tapErr
				}
				s.nextCheckpoint++
			}
			s.lastCheckpoint = time.Now()
		}
		if wm, ok := s.watermark(); ok {
			if !emit(scheduler.Element{Kind: scheduler.ElementWatermark, TS: wm}) {
				return s.tapErr
			}
		}
	}
	if !emit(scheduler.Element{Kind: scheduler.ElementWatermark, TS: math.MaxInt64}) {
		return s.tapErr
	}
	send()
	return s.tapErr
}

func (s *source) malformed(me *MalformedError, raw []byte) error {
	if s.cfg.policy != MalformedSkip {
		return me
	}
	s.skipped.Add(1)
	if s.cfg.deadLetter != nil && !me.streamed {
		if _, err := s.cfg.deadLetter.Write(deadLetter(me, raw)); err != nil {
			return fmt.Errorf("dead-letter output: %w", err)
		}
	}
	return nil
}

// deadLetter encodes one dead-letter record (docs/DESIGN.md, "Malformed input"): the line, the
// reason, and the raw record without its line terminator, losslessly: as "raw" when it is
// UTF-8 text, as "raw_base64" otherwise.
func deadLetter(me *MalformedError, raw []byte) []byte {
	var rec struct {
		Line      int64   `json:"line"`
		Reason    string  `json:"reason"`
		Raw       *string `json:"raw,omitempty"`
		RawBase64 *string `json:"raw_base64,omitempty"`
	}
	rec.Line, rec.Reason = me.Line, me.Err.Error()
	if utf8.Valid(raw) {
		r := string(raw)
		rec.Raw = &r
	} else {
		r := base64.StdEncoding.EncodeToString(raw)
		rec.RawBase64 = &r
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(&rec) // cannot fail: strings and an integer
	return buf.Bytes()
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
			return el, fmt.Errorf("field %q: %w", s.cfg.keyField, err)
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
			return el, fmt.Errorf("field %q: %w", s.cfg.timeField, err)
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

func (s *source) jsonLinesReader() *bufio.Reader { return bufio.NewReaderSize(s.in, 256<<10) }

// jsonLines returns the next non-empty line as a record value (and as its raw text).
func (s *source) jsonLines() ([]byte, []byte, int64, error) {
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
					s.line++
					return nil, nil, s.line, s.oversizeLine(long, err)
				}
			}
			line = long
		}
		if len(line) == 0 && err != nil {
			if err == io.EOF {
				return nil, nil, 0, io.EOF
			}
			return nil, nil, 0, fmt.Errorf("reading input: %w", err)
		}
		if err != nil && err != io.EOF {
			return nil, nil, 0, fmt.Errorf("reading input: %w", err)
		}
		s.line++
		line = trimEOL(line)
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if !jsonfield.Valid(line) {
			return nil, line, s.line, &MalformedError{Line: s.line, Err: jsonSyntaxError(line)}
		}
		if t := bytes.TrimSpace(line); t[0] != '{' {
			return nil, line, s.line, &MalformedError{Line: s.line, Err: errors.New("a record must be a JSON object")}
		}
		return line, line, s.line, nil
	}
}

// oversizeLine handles a line longer than the record limit, of which head has been read and err
// is the last ReadSlice's result. The line is never held whole: under MalformedSkip with a
// dead-letter output it is streamed there (as raw_base64, since its text cannot be checked
// before it is all read); otherwise the rest is skipped.
func (s *source) oversizeLine(head []byte, err error) error {
	me := &MalformedError{Line: s.line, Err: fmt.Errorf("line exceeds the %d-byte record limit", s.cfg.maxValue)}
	if s.cfg.policy != MalformedSkip || s.cfg.deadLetter == nil {
		for err == bufio.ErrBufferFull {
			_, err = s.br.ReadSlice('\n')
		}
		return me
	}
	me.streamed = true
	w := &deadLetterWriter{w: s.cfg.deadLetter}
	fmt.Fprintf(w, `{"line":%d,"reason":%s,"raw_base64":"`, me.Line, jsonString(me.Err.Error()))
	enc := base64.NewEncoder(base64.StdEncoding, w)
	// The terminator may be split over the last two chunks ("\r" then "\n"): hold back a final
	// "\r" until the next chunk shows whether a "\n" follows.
	held := false
	chunk := head
	for {
		last := err != bufio.ErrBufferFull
		if held {
			if !(last && len(chunk) == 1 && chunk[0] == '\n') {
				enc.Write([]byte{'\r'})
			}
			held = false
		}
		if last {
			chunk = trimEOL(chunk)
		} else if n := len(chunk); n > 0 && chunk[n-1] == '\r' {
			chunk, held = chunk[:n-1], true
		}
		enc.Write(chunk)
		if last {
			break
		}
		chunk, err = s.br.ReadSlice('\n')
	}
	enc.Close()
	io.WriteString(w, "\"}\n")
	if w.err != nil {
		return fmt.Errorf("dead-letter output: %w", w.err)
	}
	if err != nil && err != io.EOF {
		return fmt.Errorf("reading input: %w", err)
	}
	return me
}

// deadLetterWriter keeps the first write error.
type deadLetterWriter struct {
	w   io.Writer
	err error
}

func (e *deadLetterWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func jsonString(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}

// trimEOL drops one line terminator ("\n" or "\r\n") from the end of line. A "\r" without a
// "\n" is data.
func trimEOL(line []byte) []byte {
	if l, ok := bytes.CutSuffix(line, []byte{'\n'}); ok {
		return bytes.TrimSuffix(l, []byte{'\r'})
	}
	return line
}

func jsonSyntaxError(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	return errors.New("invalid JSON")
}

// csvRecords reads CSV with a header row and turns each row into a JSON object. A cell that is a
// valid JSON number becomes a number; everything else stays a string. A row encoding/csv cannot
// parse (a bare or unterminated quote, a wrong number of fields) is a malformed record whose raw
// text is the row as it appears in the input. A malformed header fails the run under any policy:
// no row after it can be read without one.
func (s *source) csvRecords() func() ([]byte, []byte, int64, error) {
	tee := &rawTee{r: s.in, limit: int64(s.cfg.maxValue) + 64<<10}
	cr := csv.NewReader(tee)
	cr.ReuseRecord = true
	cr.FieldsPerRecord = 0
	if s.csvHeader != nil { // resumed after the header
		cr.FieldsPerRecord = len(s.csvHeader)
	}
	s.csvReader = cr
	base := s.lineBase
	tee.lines = base
	var buf []byte
	return func() ([]byte, []byte, int64, error) {
		for {
			row, err := cr.Read()
			if err == io.EOF {
				return nil, nil, 0, io.EOF
			}
			raw := tee.next(cr.InputOffset())
			var pe *csv.ParseError
			if err != nil && !errors.As(err, &pe) {
				if errors.Is(err, errCSVTooLong) {
					return nil, nil, 0, fmt.Errorf("input line %d: a CSV record exceeds the %d-byte record limit", tee.startLine(), s.cfg.maxValue)
				}
				return nil, nil, 0, fmt.Errorf("reading input: %w", err)
			}
			if s.csvHeader == nil {
				if err != nil {
					return nil, nil, 0, fmt.Errorf("CSV header: %w", err)
				}
				s.csvHeader = append([]string(nil), row...)
				s.line = tee.startLine() - 1
				continue
			}
			if err != nil {
				s.line = tee.startLine() - 1
				return nil, raw, base + int64(pe.StartLine), &MalformedError{Line: base + int64(pe.StartLine), Err: pe.Err}
			}
			line, _ := cr.FieldPos(0) // a record without error has at least one field
			line += int(base)
			s.line = tee.startLine() - 1
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
			return buf, raw, int64(line), nil
		}
	}
}

var errCSVTooLong = errors.New("CSV record too long")

// rawTee keeps the input bytes that encoding/csv has read but not yet consumed as records, so
// that each record's raw text can go to the dead-letter output. It holds at most one record plus
// the csv reader's read-ahead; a record longer than limit fails the read (encoding/csv would
// otherwise hold it whole).
type rawTee struct {
	r     io.Reader
	limit int64
	buf   []byte // input from offset base on
	start int    // buf[:start] was returned by next and may be dropped
	base  int64
	lines int64 // line terminators in the bytes dropped so far
}

// startLine is the line number of the first byte not yet returned by next.
func (t *rawTee) startLine() int64 {
	return t.lines + int64(bytes.Count(t.buf[:t.start], []byte{'\n'})) + 1
}

func (t *rawTee) Read(p []byte) (int, error) {
	if int64(len(t.buf)-t.start) > t.limit {
		return 0, errCSVTooLong
	}
	n, err := t.r.Read(p)
	t.buf = append(t.buf, p[:n]...)
	return n, err
}

// next returns the raw text of the record that ends at input offset end: without the blank
// lines encoding/csv skipped before it and without its line terminator. The result is valid
// until the next Read.
func (t *rawTee) next(end int64) []byte {
	if t.start > 64<<10 && t.start > len(t.buf)/2 {
		t.lines += int64(bytes.Count(t.buf[:t.start], []byte{'\n'}))
		n := copy(t.buf, t.buf[t.start:])
		t.buf, t.base, t.start = t.buf[:n], t.base+int64(t.start), 0
	}
	from, to := t.start, int(end-t.base)
	to = min(max(to, from), len(t.buf))
	raw := t.buf[from:to]
	t.start = to
	for {
		if r, ok := bytes.CutPrefix(raw, []byte{'\n'}); ok {
			raw = r
		} else if r, ok := bytes.CutPrefix(raw, []byte("\r\n")); ok {
			raw = r
		} else {
			break
		}
	}
	return trimEOL(raw)
}

// isJSONNumber reports whether s is exactly a JSON number (RFC 8259 section 6): no sign but a
// leading minus, no leading zeros, no surrounding space.
func isJSONNumber(s string) bool {
	i := 0
	digits := func() int {
		n := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i, n = i+1, n+1
		}
		return n
	}
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case digits() == 0:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(s)
}
