// Package file is the file connector of pipelines: a bounded source of JSON Lines or CSV files
// whose positions are byte offsets, and an exactly-once JSON Lines sink whose output is
// committed by checkpoints.
package file

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/clink-wasm/clink-wasm/internal/jsonfield"
)

// Register adds the file source and sink to c.
func Register(c *pipeline.Connectors) {
	c.RegisterSource("file", NewSource)
	c.RegisterSink("file", NewSink)
}

// Source reads the files named by path (a file or a glob), one split per file, in name order.
type Source struct {
	paths    []string
	format   string
	maxValue int
}

// NewSource builds a file source from its spec options: path (required), format (jsonl or
// csv; default from the extension), max_record_bytes.
func NewSource(spec *pipeline.SourceSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Source, error) {
	path := o.String("path", "")
	format := o.String("format", "")
	maxValue := o.Int("max_record_bytes", 16<<20)
	if path == "" {
		o.Fail("path", "required: a file or a glob of files")
		return nil, nil
	}
	full := env.Path(path)
	var paths []string
	if strings.ContainsAny(path, "*?[") {
		m, err := filepath.Glob(full)
		if err != nil {
			o.Fail("path", "bad glob: %v", err)
			return nil, nil
		}
		paths = m
	} else {
		paths = []string{full}
	}
	sort.Strings(paths)
	if len(paths) == 0 {
		o.Fail("path", "%q matches no file", path)
		return nil, nil
	}
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			o.Fail("path", "%v", err)
			return nil, nil
		}
		if st.IsDir() {
			o.Fail("path", "%s is a directory", p)
			return nil, nil
		}
	}
	if format == "" {
		format = "jsonl"
		if strings.EqualFold(filepath.Ext(paths[0]), ".csv") {
			format = "csv"
		}
	}
	if format != "jsonl" && format != "csv" {
		o.Fail("format", "%q is not one of jsonl, csv", format)
	}
	if maxValue < 1 {
		o.Fail("max_record_bytes", "must be positive")
	}
	return &Source{paths: paths, format: format, maxValue: int(maxValue)}, nil
}

// Splits implements pipeline.Source: the file paths.
func (s *Source) Splits(ctx context.Context) ([]string, error) { return s.paths, nil }

// Bounded implements pipeline.Source.
func (s *Source) Bounded() bool { return true }

// position is a split's position: the byte offset of the next record, and its line number.
type position struct {
	Offset int64 `json:"offset"`
	Line   int64 `json:"line"`
	Done   bool  `json:"done,omitempty"`
}

// Open implements pipeline.Source.
func (s *Source) Open(ctx context.Context, splits []pipeline.Split) (pipeline.SourceReader, error) {
	r := &reader{s: s, splits: make([]pipeline.Split, len(splits)), pos: make([]position, len(splits))}
	for i, sp := range splits {
		r.splits[i] = pipeline.Split{ID: sp.ID}
		if sp.Position != nil {
			if err := json.Unmarshal(sp.Position, &r.pos[i]); err != nil {
				return nil, fmt.Errorf("split %s: bad position %q: %w", sp.ID, sp.Position, err)
			}
		}
	}
	return r, nil
}

type reader struct {
	s      *Source
	splits []pipeline.Split
	pos    []position
	cur    int // split being read
	f      *os.File
	br     *bufio.Reader
	cr     *csv.Reader
	header []string
	csvOff int64 // offset of the CSV reader's start within the file
	buf    []byte
	vals   [][]byte
}

func (r *reader) Positions() []pipeline.Split {
	out := make([]pipeline.Split, len(r.splits))
	for i := range r.splits {
		b, _ := json.Marshal(r.pos[i])
		out[i] = pipeline.Split{ID: r.splits[i].ID, Position: b}
	}
	return out
}

func (r *reader) Close() error {
	if r.f != nil {
		return r.f.Close()
	}
	return nil
}

// open opens the current split at its position.
func (r *reader) open() error {
	p := &r.pos[r.cur]
	f, err := os.Open(r.splits[r.cur].ID)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	if p.Offset > st.Size() {
		f.Close()
		return fmt.Errorf("%s is %d bytes, shorter than the checkpoint's position %d: the input changed since", r.splits[r.cur].ID, st.Size(), p.Offset)
	}
	r.f = f
	if r.s.format == "csv" {
		// The header comes from the file's start, whatever the position.
		hr := csv.NewReader(bufio.NewReader(f))
		h, err := hr.Read()
		if err == io.EOF {
			p.Done = true
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: header: %w", r.splits[r.cur].ID, err)
		}
		r.header = append([]string(nil), h...)
		start := p.Offset
		if start == 0 {
			start = hr.InputOffset()
			p.Offset, p.Line = start, 1
		}
		if _, err := f.Seek(start, io.SeekStart); err != nil {
			return err
		}
		r.csvOff = start
		r.cr = csv.NewReader(bufio.NewReaderSize(f, 256<<10))
		r.cr.FieldsPerRecord = len(r.header)
		r.cr.ReuseRecord = true
		return nil
	}
	if _, err := f.Seek(p.Offset, io.SeekStart); err != nil {
		return err
	}
	r.br = bufio.NewReaderSize(f, 256<<10)
	return nil
}

func (r *reader) Read(ctx context.Context, buf []pipeline.SourceRecord) (int, error) {
	n := 0
	r.buf = r.buf[:0]
	r.vals = r.vals[:0]
	for n < len(buf) {
		if r.cur >= len(r.splits) {
			if n > 0 {
				break
			}
			return 0, io.EOF
		}
		if r.pos[r.cur].Done {
			r.next()
			continue
		}
		if r.f == nil {
			if err := r.open(); err != nil {
				return n, err
			}
			if r.pos[r.cur].Done {
				continue
			}
		}
		rec, ok, err := r.readOne()
		if err != nil {
			return n, err
		}
		if !ok {
			r.pos[r.cur].Done = true
			r.next()
			continue
		}
		buf[n] = rec
		n++
	}
	// Values were appended to one buffer: slice them now that it no longer grows.
	off := 0
	for i := range n {
		l := len(buf[i].Value)
		buf[i].Value = r.buf[off : off+l : off+l]
		off += l
	}
	return n, nil
}

func (r *reader) next() {
	if r.f != nil {
		r.f.Close()
		r.f, r.br, r.cr = nil, nil, nil
	}
	r.cur++
}

// readOne reads the next record of the current split. The returned record's Value has the
// right length but is placed by Read.
func (r *reader) readOne() (pipeline.SourceRecord, bool, error) {
	p := &r.pos[r.cur]
	if r.cr != nil {
		return r.readCSV(p)
	}
	for {
		line, err := r.br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			long := bytes.Clone(line)
			for err == bufio.ErrBufferFull {
				line, err = r.br.ReadSlice('\n')
				long = append(long, line...)
				if len(long) > r.s.maxValue+1 {
					for err == bufio.ErrBufferFull {
						line, err = r.br.ReadSlice('\n')
						long = append(long, line...)
					}
					start := p.Offset
					p.Offset += int64(len(long))
					p.Line++
					return r.malformed(long[:min(len(long), 256)], start, fmt.Errorf("line %d exceeds the %d-byte record limit", p.Line, r.s.maxValue)), true, nil
				}
			}
			line = long
		}
		if len(line) == 0 && err == io.EOF {
			return pipeline.SourceRecord{}, false, nil
		}
		if err != nil && err != io.EOF {
			return pipeline.SourceRecord{}, false, fmt.Errorf("reading %s: %w", r.splits[r.cur].ID, err)
		}
		start := p.Offset
		p.Offset += int64(len(line))
		p.Line++
		v := bytes.TrimRight(line, "\r\n")
		if len(bytes.TrimSpace(v)) == 0 {
			continue
		}
		if !jsonfield.Valid(v) {
			return r.malformed(v, start, fmt.Errorf("line %d is not valid JSON", p.Line)), true, nil
		}
		if bytes.TrimSpace(v)[0] != '{' {
			return r.malformed(v, start, fmt.Errorf("line %d: a record must be a JSON object", p.Line)), true, nil
		}
		r.buf = append(r.buf, v...)
		return pipeline.SourceRecord{Split: r.cur, Value: v[:len(v):len(v)], Pos: start}, true, nil
	}
}

func (r *reader) malformed(raw []byte, pos int64, err error) pipeline.SourceRecord {
	r.buf = append(r.buf, raw...)
	return pipeline.SourceRecord{Split: r.cur, Value: raw, Pos: pos, Malformed: fmt.Errorf("%s: %w", filepath.Base(r.splits[r.cur].ID), err)}
}

func (r *reader) readCSV(p *position) (pipeline.SourceRecord, bool, error) {
	row, err := r.cr.Read()
	start := p.Offset
	if err == io.EOF {
		return pipeline.SourceRecord{}, false, nil
	}
	p.Offset = r.csvOff + r.cr.InputOffset()
	p.Line++
	if err != nil {
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			return r.malformed(nil, start, fmt.Errorf("CSV record at byte %d: %v", start, pe.Err)), true, nil
		}
		return pipeline.SourceRecord{}, false, fmt.Errorf("reading %s: %w", r.splits[r.cur].ID, err)
	}
	from := len(r.buf)
	r.buf = append(r.buf, '{')
	for i, h := range r.header {
		if i > 0 {
			r.buf = append(r.buf, ',')
		}
		hb, _ := json.Marshal(h)
		r.buf = append(r.buf, hb...)
		r.buf = append(r.buf, ':')
		if isJSONNumber(row[i]) {
			r.buf = append(r.buf, row[i]...)
		} else {
			kb, _ := json.Marshal(row[i])
			r.buf = append(r.buf, kb...)
		}
	}
	r.buf = append(r.buf, '}')
	v := r.buf[from:]
	if len(v) > r.s.maxValue {
		r.buf = r.buf[:from]
		return r.malformed(nil, start, fmt.Errorf("CSV record at byte %d exceeds the %d-byte record limit", start, r.s.maxValue)), true, nil
	}
	return pipeline.SourceRecord{Split: r.cur, Value: v, Pos: start}, true, nil
}

// isJSONNumber is the CSV cell rule of host/pipeline's flag form (copied: it is unexported
// there): a cell that is a valid JSON number becomes a number.
func isJSONNumber(s string) bool {
	if s == "" {
		return false
	}
	var n json.Number
	return json.Unmarshal([]byte(s), &n) == nil && s[0] != '+' && s != "-"
}
