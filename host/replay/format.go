// Package replay records what a `clink-wasm run` saw at the host's seams, and replays a module
// against such a recording with no network and no state tier.
//
// A [Recorder] wraps the seams the pipeline already has: the elements the source hands the
// scheduler (records with their positions, watermarks), the [state.Backend] (values served,
// hot or cold, found or not; the first write of each key), the [scheduler.LookupFunc] (the
// request the guest wrote, the status and body it got, or its error code) and the
// [scheduler.Sink] (every output with the record or timer that produced it). It streams each
// to a JSON Lines file in the recording directory, with a size cap.
//
// [Run] loads a module, feeds it the recorded elements through the production scheduler, serves
// state reads from the recorded values and lookups from the recorded responses, and compares
// the outputs with the recorded ones, record by record. A read or lookup the recording does not
// hold is a divergence: nothing reaches a network or a state pool.
//
// The format is versioned and documented in docs/recording.md; this file is its one
// definition. A recording holds lookup bodies and state values: it is the user's data. The
// values of the headers the host injects into lookups (the endpoint secrets) are never written:
// the recorder replaces any occurrence of them with [Redacted].
package replay

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// Format and Version identify a recording (recording.json's "format" and "version"). A reader
// refuses another format and any version it does not know.
const (
	Format  = "clink-recording"
	Version = 1
)

// File names inside a recording directory.
const (
	ManifestFile = "recording.json"
	InputFile    = "input.jsonl"
	StateFile    = "state.jsonl"
	LookupFile   = "lookups.jsonl"
	OutputFile   = "output.jsonl"
)

// Redacted replaces every occurrence of an injected secret in recorded bytes.
const Redacted = "[redacted]"

// MaxLine bounds one line of a recording file when it is read (a lookup body may be 16 MiB,
// and escaping can grow it).
const MaxLine = 128 << 20

// Status says how a recorded run ended.
type Status string

const (
	// StatusRecording: the run has not finished (or the process died): the files may end
	// anywhere.
	StatusRecording Status = "recording"
	// StatusComplete: the run finished and every file is whole.
	StatusComplete Status = "complete"
	// StatusFailed: the run failed (Manifest.Error says how); the files hold what it saw up to
	// then.
	StatusFailed Status = "failed"
	// StatusTruncated: the recording reached its size cap and the run was stopped.
	StatusTruncated Status = "truncated"
)

// Manifest is recording.json.
type Manifest struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	Status  Status `json:"status"`
	Created string `json:"created,omitempty"` // RFC 3339

	Operator     string   `json:"operator"`
	ModuleSHA256 string   `json:"module_sha256"`
	States       []string `json:"states,omitempty"`
	// Endpoints are the endpoints the module declared, in manifest order.
	Endpoints []Endpoint `json:"endpoints,omitempty"`
	Order     string     `json:"order"` // key, input or none
	KeyField  string     `json:"key_field,omitempty"`
	TimeField string     `json:"time_field,omitempty"`
	// StateOrigin is "empty" when the run started with no state (no restore): a read the
	// recording does not hold is then known to find nothing. Otherwise "checkpoint N" or
	// "unknown" (a Backend given by a program).
	StateOrigin string     `json:"state_origin"`
	Limits      abi.Limits `json:"limits"`

	Counts   Counts   `json:"counts"`
	Bytes    int64    `json:"bytes"`              // bytes of the .jsonl files
	MaxBytes int64    `json:"max_bytes"`          // the cap the recording ran under
	Redacted int64    `json:"redacted,omitempty"` // occurrences of secrets replaced
	Error    *Failure `json:"error,omitempty"`
}

// StateOriginEmpty is Manifest.StateOrigin for a run that started with no state.
const StateOriginEmpty = "empty"

// Endpoint names one endpoint of the recorded run. Base is its origin and path, without
// credentials or query.
type Endpoint struct {
	Name string `json:"name"`
	Base string `json:"base,omitempty"`
}

// Counts are the lines of each file.
type Counts struct {
	Records    int64 `json:"records"`
	Watermarks int64 `json:"watermarks"`
	StateReads int64 `json:"state_reads"`
	Writes     int64 `json:"state_writes"`
	Lookups    int64 `json:"lookups"`
	Outputs    int64 `json:"outputs"`
}

// Failure is how a run failed.
type Failure struct {
	Message string `json:"message"`
	// Where, Key and TS name the record or timer that failed, for an operator fault
	// ("input line 42", "timer at 1700000000000").
	Where string `json:"where,omitempty"`
	Key   Bytes  `json:"key,omitempty"`
	TS    int64  `json:"ts,omitempty"`
}

// Source is what produced an output: a record (by input position and key) or a timer (by key
// and time). Nil in an Output: emitted outside any record (clink_open, clink_close).
type Source struct {
	Pos   int64 `json:"pos"`
	Key   Bytes `json:"key"`
	TS    int64 `json:"ts"`
	Timer bool  `json:"timer,omitempty"`
}

// Element kinds in input.jsonl.
const (
	KindRecord    = "record"
	KindWatermark = "watermark"
)

// Element is one line of input.jsonl: a record as the source handed it to the scheduler, or a
// watermark.
type Element struct {
	Kind  string `json:"kind"`
	Pos   int64  `json:"pos,omitempty"`
	Key   Bytes  `json:"key,omitempty"`
	Value Bytes  `json:"value,omitempty"`
	TS    int64  `json:"ts"`
	// KeyByModule: the module's clink_key keys the record (Key is then empty).
	KeyByModule bool `json:"key_by_module,omitempty"`
}

// State operations in state.jsonl.
const (
	OpGet           = "get"
	OpPut           = "put"
	OpDelete        = "delete"
	OpOperatorState = "operator_state"
)

// StateOp is one line of state.jsonl. A get is a value served to the run (Tier "hot" or
// "cold"; Found false for a miss). A put or delete marks the first write of a key by the run
// (values written are not recorded: a replay writes its own). An operator_state is a non-keyed
// blob the run read when it started (the restored timer queue), by Name.
type StateOp struct {
	Op    string `json:"op"`
	State string `json:"state,omitempty"`
	Key   Bytes  `json:"key,omitempty"`
	Entry Bytes  `json:"entry,omitempty"`
	Found bool   `json:"found,omitempty"`
	Value Bytes  `json:"value,omitempty"`
	Tier  string `json:"tier,omitempty"`
	Name  string `json:"name,omitempty"`
}

// Lookup is one line of lookups.jsonl: a request the guest sent through an endpoint and what
// it got back: a Status and Body, or Error (an ABI code name such as LOOKUP_TIMEOUT; "fatal: …"
// for a host failure that failed the run). Guests see no response headers in ABI v1, so none
// are recorded.
type Lookup struct {
	Endpoint string `json:"endpoint"`
	Request  Bytes  `json:"request"`
	Status   int    `json:"status,omitempty"`
	Body     Bytes  `json:"body,omitempty"`
	Error    string `json:"error,omitempty"`
}

// Output is one line of output.jsonl: a record the operator emitted, in the order the sink got
// it, with its source.
type Output struct {
	Src   *Source `json:"src,omitempty"`
	Key   Bytes   `json:"key"`
	Value Bytes   `json:"value"`
	TS    int64   `json:"ts"`
}

// Bytes is a byte string in a recording: a JSON string when it is valid UTF-8 (so text and JSON
// values stay readable and editable), else {"base64": "..."}. A missing field or null is nil.
type Bytes []byte

// MarshalJSON implements json.Marshaler.
func (b Bytes) MarshalJSON() ([]byte, error) {
	if b == nil {
		return []byte("null"), nil
	}
	if utf8.Valid(b) {
		return json.Marshal(string(b))
	}
	return json.Marshal(struct {
		B64 string `json:"base64"`
	}{base64.StdEncoding.EncodeToString(b)})
}

// UnmarshalJSON implements json.Unmarshaler.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case bytes.Equal(data, []byte("null")):
		*b = nil
		return nil
	case len(data) > 0 && data[0] == '"':
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		*b = Bytes(s)
		return nil
	case len(data) > 0 && data[0] == '{':
		var o struct {
			B64 *string `json:"base64"`
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&o); err != nil {
			return fmt.Errorf("bytes: %w", err)
		}
		if o.B64 == nil {
			return errors.New(`bytes: want a string or {"base64": "..."}`)
		}
		v, err := base64.StdEncoding.DecodeString(*o.B64)
		if err != nil {
			return fmt.Errorf("bytes: base64: %w", err)
		}
		*b = Bytes(v)
		return nil
	}
	return errors.New(`bytes: want a string or {"base64": "..."}`)
}

// ErrFormat marks a recording that cannot be read: another format, an unknown version, a line
// that does not parse. It is permanent: the files must be fixed.
var ErrFormat = errors.New("not a readable recording")

// FormatError names the file and line at fault.
type FormatError struct {
	File string
	Line int64 // 0 for the whole file
	Err  error
}

func (e *FormatError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.File, e.Err)
}

func (e *FormatError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrFormat) true.
func (e *FormatError) Is(target error) bool { return target == ErrFormat }

// ReadManifest reads and checks dir's recording.json.
func ReadManifest(dir string) (*Manifest, error) {
	path := filepath.Join(dir, ManifestFile)
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s is not a recording (no %s): record one with clink-wasm run --record %s: %w", dir, ManifestFile, dir, err)
		}
		return nil, err
	}
	m, err := ParseManifest(b)
	if err != nil {
		return nil, &FormatError{File: path, Err: err}
	}
	return m, nil
}

// ParseManifest parses and checks a recording.json.
func ParseManifest(b []byte) (*Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("data after the manifest object")
	}
	if m.Format != Format {
		return nil, fmt.Errorf("format %q is not %q", m.Format, Format)
	}
	if m.Version != Version {
		return nil, fmt.Errorf("format version %d is not supported (this clink-wasm reads version %d)", m.Version, Version)
	}
	switch m.Status {
	case StatusRecording, StatusComplete, StatusFailed, StatusTruncated:
	default:
		return nil, fmt.Errorf("unknown status %q", m.Status)
	}
	switch m.Order {
	case "key", "input", "none":
	default:
		return nil, fmt.Errorf("order %q: want key, input or none", m.Order)
	}
	seen := map[string]bool{}
	for _, e := range m.Endpoints {
		if e.Name == "" || seen[e.Name] {
			return nil, fmt.Errorf("endpoint name %q is empty or repeated", e.Name)
		}
		seen[e.Name] = true
	}
	return &m, nil
}

// lineReader reads one JSON object per line of a recording file. Blank lines are skipped.
type lineReader struct {
	path string
	r    *bufio.Reader
	line int64
	buf  []byte
}

func newLineReader(path string, r io.Reader) *lineReader {
	return &lineReader{path: path, r: bufio.NewReaderSize(r, 64<<10)}
}

// next decodes the next line into v; io.EOF at the end.
func (l *lineReader) next(v any) error {
	for {
		l.buf = l.buf[:0]
		for {
			chunk, err := l.r.ReadSlice('\n')
			if len(l.buf)+len(chunk) > MaxLine {
				return &FormatError{File: l.path, Line: l.line + 1, Err: fmt.Errorf("line longer than %d bytes", MaxLine)}
			}
			l.buf = append(l.buf, chunk...)
			if err == bufio.ErrBufferFull {
				continue
			}
			if err == io.EOF {
				if len(l.buf) == 0 {
					return io.EOF
				}
				break
			}
			if err != nil {
				return fmt.Errorf("%s: %w", l.path, err)
			}
			break
		}
		l.line++
		if len(bytes.TrimSpace(l.buf)) == 0 {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(l.buf))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			return &FormatError{File: l.path, Line: l.line, Err: err}
		}
		if dec.More() {
			return &FormatError{File: l.path, Line: l.line, Err: errors.New("more than one JSON value on the line")}
		}
		return nil
	}
}

// checkElement validates an input line.
func checkElement(e *Element) error {
	switch e.Kind {
	case KindRecord:
		if e.KeyByModule && len(e.Key) > 0 {
			return errors.New("a record keyed by the module has no key")
		}
	case KindWatermark:
		if e.Pos != 0 || e.Key != nil || e.Value != nil || e.KeyByModule {
			return errors.New("a watermark has only a ts")
		}
	default:
		return fmt.Errorf("kind %q: want record or watermark", e.Kind)
	}
	return nil
}

// checkStateOp validates a state line.
func checkStateOp(s *StateOp) error {
	switch s.Op {
	case OpGet:
		if s.State == "" {
			return errors.New("get without a state name")
		}
		if !s.Found && s.Value != nil {
			return errors.New("a get that found nothing has no value")
		}
		if s.Tier != "" && s.Tier != "hot" && s.Tier != "cold" {
			return fmt.Errorf("tier %q: want hot or cold", s.Tier)
		}
	case OpPut, OpDelete:
		if s.State == "" {
			return fmt.Errorf("%s without a state name", s.Op)
		}
		if s.Value != nil || s.Found {
			return fmt.Errorf("a %s records the key only", s.Op)
		}
	case OpOperatorState:
		if s.Name == "" {
			return errors.New("operator_state without a name")
		}
	default:
		return fmt.Errorf("op %q: want get, put, delete or operator_state", s.Op)
	}
	return nil
}

// checkLookup validates a lookup line.
func checkLookup(l *Lookup) error {
	switch {
	case l.Endpoint == "":
		return errors.New("lookup without an endpoint")
	case l.Error != "" && (l.Status != 0 || l.Body != nil):
		return errors.New("a failed lookup has no status or body")
	case l.Error == "" && (l.Status < 100 || l.Status > 999):
		return fmt.Errorf("status %d: want 100..999 (or an error)", l.Status)
	case l.Error != "":
		if _, ok := codeByName(l.Error); !ok && !isFatal(l.Error) {
			return fmt.Errorf("error %q: want an ABI code name such as LOOKUP_TIMEOUT, or \"fatal: ...\"", l.Error)
		}
	}
	return nil
}

func checkOutput(o *Output) error {
	if o.Value == nil {
		return errors.New("output without a value")
	}
	return nil
}

func isFatal(s string) bool { return len(s) > 7 && s[:7] == "fatal: " }

// codeByName finds the ABI result code named s (docs/abi.md, "Result codes").
func codeByName(s string) (abi.Code, bool) {
	for c := abi.Code(-1); c >= -64; c-- {
		if c.String() == s && !strings.HasPrefix(s, "CODE(") {
			return c, true
		}
	}
	return 0, false
}

// ReadFile calls fn for each line of one of dir's .jsonl files, decoded and checked, in file
// order. T is Element, StateOp, Lookup or Output. A missing file has no lines.
func ReadFile[T any](dir, name string, fn func(line int64, v *T) error) error {
	path := filepath.Join(dir, name)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return readLines(path, f, fn)
}

func readLines[T any](path string, r io.Reader, fn func(line int64, v *T) error) error {
	lr := newLineReader(path, r)
	for {
		var v T
		err := lr.next(&v)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var cerr error
		switch x := any(&v).(type) {
		case *Element:
			cerr = checkElement(x)
		case *StateOp:
			cerr = checkStateOp(x)
		case *Lookup:
			cerr = checkLookup(x)
		case *Output:
			cerr = checkOutput(x)
		}
		if cerr != nil {
			return &FormatError{File: path, Line: lr.line, Err: cerr}
		}
		if err := fn(lr.line, &v); err != nil {
			return err
		}
	}
}
