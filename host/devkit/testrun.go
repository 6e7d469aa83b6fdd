package devkit

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// Table is a test table (tests.json).
type Table struct {
	Cases []Case `json:"cases"`
	// Lookups are scripted responses every case may use, after its own.
	Lookups []Lookup `json:"lookups,omitempty"`
}

// A Case runs its input, from a fresh instance and the given initial state, and compares what
// happened with Expect.
type Case struct {
	Name string `json:"name"`
	// Input is the sequence of records, with watermarks between them.
	Input []Step `json:"input"`
	// State is the initial keyed state: record key -> state name -> entry -> value.
	State StateMap `json:"state,omitempty"`
	// Lookups script the responses of lookup calls, matched by the request line
	// ("GET /geo?ip=1.2.3.4"), or by the whole request when Request has more than one line
	// (headers, a body), and by the endpoint name (any endpoint when empty). The table's
	// Lookups are tried after the case's. A lookup with no matching entry fails the case.
	Lookups []Lookup `json:"lookups,omitempty"`
	Expect  Expect   `json:"expect"`
}

// A Step is a record, or a watermark when Watermark is set.
type Step struct {
	// Value is the record's value: a JSON object (or any JSON value) is used as its text; a
	// JSON string is used as the record's raw bytes.
	Value json.RawMessage `json:"value,omitempty"`
	// ValueHex is the record's value as hex, for bytes that are not text.
	ValueHex string `json:"value_hex,omitempty"`
	// Key is the record key; when absent it is the value's top-level field named by the
	// project's key (clink.json "key", default "user"), as `clink-wasm run --key` takes it.
	Key *string `json:"key,omitempty"`
	// KeyByModule has the module key the record (its clink_key export), as `clink-wasm run`
	// does when no key field is given.
	KeyByModule bool `json:"key_by_module,omitempty"`
	// Ts is the record's event time (ms).
	Ts int64 `json:"ts,omitempty"`
	// Watermark advances the watermark to this value and fires the timers that are due.
	Watermark *int64 `json:"watermark,omitempty"`
}

// Lookup is a scripted lookup response: a status and body, or an error (a LOOKUP_* code name:
// LOOKUP_TIMEOUT, LOOKUP_UNAVAILABLE, LOOKUP_REFUSED, ...).
type Lookup struct {
	Endpoint string `json:"endpoint,omitempty"`
	Request  string `json:"request"`
	Status   int    `json:"status,omitempty"`
	Body     string `json:"body,omitempty"`
	Error    string `json:"error,omitempty"`
	// LatencyMS delays the response (or the failure) by this long. The production host runs
	// other keys meanwhile, so latency can reorder outputs across keys (never within a key).
	LatencyMS int64 `json:"latency_ms,omitempty"`
}

// Expect is what a case must produce. Outputs are compared in order, as compact JSON (a JSON
// string is compared with the raw output bytes); OutputsByKey instead compares each record
// key's outputs in order and leaves the order between keys free (give one of the two); State
// lists entries that must hold these values at the end (null: absent); Error, when set, is a
// substring of the fault the case must end with.
type Expect struct {
	Outputs      []json.RawMessage            `json:"outputs"`
	OutputsByKey map[string][]json.RawMessage `json:"outputs_by_key,omitempty"`
	// OutsideOutputs, with OutputsByKey, are the outputs of clink_open and clink_close (one
	// per instance the host ran), in order; unchecked when absent.
	OutsideOutputs *[]json.RawMessage `json:"outside_outputs,omitempty"`
	State          StateMap           `json:"state,omitempty"`
	Error          string             `json:"error,omitempty"`
}

// StateMap is record key -> state name -> entry -> value.
type StateMap map[string]map[string]map[string]*Value

// Value is a state value in a test table: a JSON string (its bytes), or {"i64": N} (8 bytes,
// little-endian, what the SDKs' PutInt64 writes), or {"hex": "..."}.
type Value struct{ b []byte }

// MarshalJSON implements json.Marshaler: a string when the bytes are UTF-8 text, else hex.
func (v *Value) MarshalJSON() ([]byte, error) {
	if utf8.Valid(v.b) {
		return json.Marshal(string(v.b))
	}
	return json.Marshal(map[string]string{"hex": hex.EncodeToString(v.b)})
}

// Bytes returns the value's bytes.
func (v *Value) Bytes() []byte { return v.b }

// NewValue returns a state value holding b.
func NewValue(b []byte) *Value { return &Value{b: bytes.Clone(b)} }

func decodeHex(h string) ([]byte, error) {
	b, err := hex.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("hex value %q: %w", h, err)
	}
	return b, nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (v *Value) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v.b = []byte(s)
		return nil
	}
	var o struct {
		I64 *int64  `json:"i64"`
		Hex *string `json:"hex"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil || (o.I64 == nil) == (o.Hex == nil) {
		return fmt.Errorf(`a state value is a string, {"i64": N} or {"hex": "..."}, not %s`, b)
	}
	if o.I64 != nil {
		v.b = make([]byte, 8)
		for i := range 8 {
			v.b[i] = byte(uint64(*o.I64) >> (8 * i))
		}
		return nil
	}
	b, err := decodeHex(*o.Hex)
	if err != nil {
		return fmt.Errorf("state value: %w", err)
	}
	v.b = b
	return nil
}

// describe renders a state value for a diff: as {"i64": N} when it is 8 bytes and the
// expectation is an integer, else as a Go-quoted string.
func describe(b []byte, asInt bool) string {
	if asInt && len(b) == 8 {
		var n uint64
		for i := range 8 {
			n |= uint64(b[i]) << (8 * i)
		}
		return fmt.Sprintf(`{"i64": %d}`, int64(n))
	}
	return strconv.Quote(string(b))
}

// LoadTable reads a test table.
func LoadTable(path string) (*Table, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var t Table
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(t.Cases) == 0 {
		return nil, fmt.Errorf("%s: no cases", path)
	}
	return &t, nil
}

// CaseResult is one case's outcome; Diff is empty when it passed.
type CaseResult struct {
	Name string
	Diff []string
	// Outputs are what the module emitted, in the order the host's sink received them.
	Outputs []Output
}

// Output is one output record: its value and the key of the record or timer that produced it
// (Outside: clink_open or clink_close produced it).
type Output struct {
	Key     string
	Value   []byte
	Outside bool
}

// ErrFailed is returned by Test when a case failed.
var ErrFailed = errors.New("test cases failed")

// Test runs the project's tests.json against its built module in the production host and
// writes one line per case to w, with a diff for each failure. It returns ErrFailed when a
// case failed.
func Test(ctx context.Context, dir string, w io.Writer) ([]CaseResult, error) {
	return TestTable(ctx, dir, "", w)
}

// TestTable is Test with another table than the project's tests.json ("" for tests.json), such
// as one written by `clink-wasm replay --cases` (FromRecording).
func TestTable(ctx context.Context, dir, tablePath string, w io.Writer) ([]CaseResult, error) {
	p, err := LoadProject(dir)
	if err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(filepath.Join(dir, p.Module()))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s is not built yet: run clink-wasm build", p.Module())
	}
	if err != nil {
		return nil, err
	}
	if tablePath == "" {
		tablePath = filepath.Join(dir, "tests.json")
	}
	table, err := LoadTable(tablePath)
	if err != nil {
		return nil, err
	}
	return RunTable(ctx, bin, p.Key, table, w)
}

// TestFiles runs the test table at tablePath against the module at modulePath, outside a
// project; keyField keys records that give no key (default "user").
func TestFiles(ctx context.Context, modulePath, tablePath, keyField string, w io.Writer) ([]CaseResult, error) {
	bin, err := os.ReadFile(modulePath)
	if err != nil {
		return nil, fmt.Errorf("reading module: %w", err)
	}
	table, err := LoadTable(tablePath)
	if err != nil {
		return nil, err
	}
	if keyField == "" {
		keyField = "user"
	}
	return RunTable(ctx, bin, keyField, table, w)
}

// RunTable runs every case of table against the module bin; keyField keys records that give no
// key of their own.
func RunTable(ctx context.Context, bin []byte, keyField string, table *Table, w io.Writer) ([]CaseResult, error) {
	eng, err := abi.NewEngine(ctx)
	if err != nil {
		return nil, err
	}
	defer eng.Close(context.WithoutCancel(ctx))
	m, err := eng.Load(ctx, bin)
	if err != nil {
		return nil, err
	}
	var results []CaseResult
	failed := 0
	for i := range table.Cases {
		c := &table.Cases[i]
		name := c.Name
		if name == "" {
			name = "case " + strconv.Itoa(i+1)
		}
		res, err := runCase(ctx, m, keyField, c, table.Lookups)
		if err != nil {
			return results, fmt.Errorf("%s: %w", name, err)
		}
		res.Name = name
		results = append(results, *res)
		if len(res.Diff) == 0 {
			fmt.Fprintf(w, "ok    %s\n", name)
			continue
		}
		failed++
		fmt.Fprintf(w, "FAIL  %s\n", name)
		for _, d := range res.Diff {
			fmt.Fprintf(w, "      %s\n", d)
		}
	}
	fmt.Fprintf(w, "%d of %d cases passed\n", len(table.Cases)-failed, len(table.Cases))
	if failed > 0 {
		return results, ErrFailed
	}
	return results, nil
}

// stepValue is a step's record value: the bytes of value_hex, of a JSON string, or the compact
// text of any other JSON value.
func stepValue(s *Step) ([]byte, error) {
	if s.ValueHex != "" {
		if len(s.Value) > 0 {
			return nil, errors.New(`give "value" or "value_hex", not both`)
		}
		return decodeHex(s.ValueHex)
	}
	if len(s.Value) == 0 {
		return []byte{}, nil
	}
	var str string
	if json.Unmarshal(s.Value, &str) == nil {
		return []byte(str), nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, s.Value); err != nil {
		return nil, fmt.Errorf("value is not JSON: %w", err)
	}
	return b.Bytes(), nil
}

// elements turns a case's input into the scheduler's elements: records at position i+1 (the
// step's number in the case, which errors name), watermarks between them.
func elements(c *Case, keyField string) ([]scheduler.Element, error) {
	els := make([]scheduler.Element, 0, len(c.Input))
	for i := range c.Input {
		s := &c.Input[i]
		if s.Watermark != nil {
			if len(s.Value) > 0 || s.ValueHex != "" || s.Key != nil || s.KeyByModule {
				return nil, fmt.Errorf("input %d: a watermark step has no value or key", i+1)
			}
			els = append(els, scheduler.Element{Kind: scheduler.ElementWatermark, TS: *s.Watermark})
			continue
		}
		value, err := stepValue(s)
		if err != nil {
			return nil, fmt.Errorf("input %d: %w", i+1, err)
		}
		el := scheduler.Element{Kind: scheduler.ElementRecord, Value: value, TS: s.Ts, Pos: int64(i + 1)}
		switch {
		case s.KeyByModule:
			if s.Key != nil {
				return nil, fmt.Errorf(`input %d: give "key" or "key_by_module", not both`, i+1)
			}
			el.Key, el.KeyByWasm = []byte{}, true
		case s.Key != nil:
			el.Key = []byte(*s.Key)
		default:
			if el.Key, err = fieldKey(value, keyField); err != nil {
				return nil, fmt.Errorf("input %d: %w (give \"key\" or a %q field)", i+1, err, keyField)
			}
		}
		els = append(els, el)
	}
	return els, nil
}

// runCase runs one case in the production host: the async execution controller
// (host/scheduler) over the module, with an in-memory state backend seeded with the case's
// initial state and the case's lookups answered by a script, after their latency. The error is
// for a table that cannot be run (a malformed record, an unknown state or lookup error name).
func runCase(ctx context.Context, m *abi.Module, keyField string, c *Case, shared []Lookup) (*CaseResult, error) {
	states := map[string]state.StateID{}
	for i, s := range m.Manifest.States {
		states[s] = state.StateID(i)
	}
	if c.Expect.OutputsByKey != nil && len(c.Expect.Outputs) > 0 {
		return nil, errors.New(`expect gives "outputs" and "outputs_by_key": give one`)
	}
	if c.Expect.OutsideOutputs != nil && c.Expect.OutputsByKey == nil {
		return nil, errors.New(`expect gives "outside_outputs" without "outputs_by_key" ("outputs" lists them in order)`)
	}
	lookups := slices.Concat(c.Lookups, shared)
	for _, l := range lookups {
		if l.Error != "" {
			if _, ok := lookupCodes[l.Error]; !ok {
				return nil, fmt.Errorf("lookup %q: unknown error %q (want a LOOKUP_* code name)", l.Request, l.Error)
			}
		}
		if l.LatencyMS < 0 {
			return nil, fmt.Errorf("lookup %q: latency_ms must be >= 0, not %d", l.Request, l.LatencyMS)
		}
	}
	els, err := elements(c, keyField)
	if err != nil {
		return nil, err
	}
	mem := state.NewMemory()
	if err := mem.Open(m.Manifest.States); err != nil {
		return nil, err
	}
	for key, byState := range c.State {
		for name, entries := range byState {
			id, ok := states[name]
			if !ok {
				return nil, fmt.Errorf("initial state names %q, which the module does not declare (it declares %v)", name, m.Manifest.States)
			}
			for entry, v := range entries {
				if v != nil {
					mem.Put(state.Key{State: id, Record: []byte(key), Entry: []byte(entry)}, v.b)
				}
			}
		}
	}

	sl := newScriptedLookups(lookups, m.Manifest.Endpoints)
	var got []Output
	sink := scheduler.SinkFunc(func(b *scheduler.Batch) error {
		for i := range b.Outputs {
			o := &b.Outputs[i]
			if o.Kind != scheduler.OutputData {
				continue
			}
			out := Output{Value: bytes.Clone(o.Value), Outside: o.Src.Key == nil && o.Src.Pos == 0 && !o.Src.Timer}
			if !out.Outside {
				out.Key = string(o.Src.Key)
			}
			got = append(got, out)
		}
		b.Release()
		return nil
	})
	// No spare instances: a table's clink_open and clink_close outputs follow from its input.
	ctrl, err := scheduler.New(m, mem, sink, scheduler.WithLookup(sl.do), scheduler.WithSpareInstances(false),
		scheduler.WithDescribe(func(pos int64) string { return fmt.Sprintf("input %d", pos) }))
	if err != nil {
		return nil, err
	}
	in := make(chan []scheduler.Element, 1)
	in <- els
	close(in)
	runCtx, cancel := context.WithCancel(ctx)
	runErr := ctrl.Run(runCtx, in)
	cancel()
	sl.wg.Wait() // every scripted response has been delivered or cancelled
	if err := sl.error(); err != nil {
		runErr = err
	}

	res := &CaseResult{Outputs: got}
	var diff []string
	switch {
	case c.Expect.Error == "" && runErr != nil:
		diff = append(diff, "error: "+runErr.Error())
	case c.Expect.Error != "" && runErr == nil:
		diff = append(diff, fmt.Sprintf("error: none, want one containing %q", c.Expect.Error))
	case c.Expect.Error != "" && !strings.Contains(runErr.Error(), c.Expect.Error):
		diff = append(diff, fmt.Sprintf("error: %v, want one containing %q", runErr, c.Expect.Error))
	}
	if c.Expect.OutputsByKey != nil {
		diff = append(diff, diffByKey(c.Expect.OutputsByKey, c.Expect.OutsideOutputs, got)...)
	} else {
		vals := make([][]byte, len(got))
		for i := range got {
			vals[i] = got[i].Value
		}
		diff = append(diff, diffOutputs("outputs", c.Expect.Outputs, vals)...)
	}
	var stateDiff []string
	for key, byState := range c.Expect.State {
		for name, entries := range byState {
			id, ok := states[name]
			if !ok {
				return nil, fmt.Errorf("expected state names %q, which the module does not declare", name)
			}
			for entry, want := range entries {
				got, found, _ := mem.Get(state.Key{State: id, Record: []byte(key), Entry: []byte(entry)})
				where := fmt.Sprintf("state %s[%q] of key %q", name, entry, key)
				switch {
				case want == nil && found:
					stateDiff = append(stateDiff, fmt.Sprintf("%s: %s, want absent", where, describe(got, len(got) == 8)))
				case want != nil && !found:
					stateDiff = append(stateDiff, fmt.Sprintf("%s: absent, want %s", where, describe(want.b, len(want.b) == 8)))
				case want != nil && !bytes.Equal(got, want.b):
					asInt := len(want.b) == 8
					stateDiff = append(stateDiff, fmt.Sprintf("%s: %s, want %s", where, describe(got, asInt), describe(want.b, asInt)))
				}
			}
		}
	}
	slices.Sort(stateDiff) // map order is random: a stable report
	res.Diff = append(diff, stateDiff...)
	return res, nil
}

// diffByKey compares each record key's outputs in order; the order between keys is free, as the
// production host runs keys concurrently. Outputs made outside any record or timer
// (clink_open, clink_close) are compared with outside when it is given.
func diffByKey(want map[string][]json.RawMessage, outside *[]json.RawMessage, got []Output) []string {
	byKey := map[string][][]byte{}
	var outs [][]byte
	for _, o := range got {
		if o.Outside {
			outs = append(outs, o.Value)
			continue
		}
		byKey[o.Key] = append(byKey[o.Key], o.Value)
	}
	keys := make([]string, 0, len(want)+len(byKey))
	for k := range want {
		keys = append(keys, k)
	}
	for k := range byKey {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []string
	for _, k := range keys {
		out = append(out, diffOutputs(fmt.Sprintf("outputs of key %q", k), want[k], byKey[k])...)
	}
	if outside != nil {
		out = append(out, diffOutputs("outputs outside any record (clink_open, clink_close)", *outside, outs)...)
	}
	return out
}

// scriptedLookups is the case's scheduler.LookupFunc: it answers from the case's "lookups",
// after each one's latency, on a timer, so that the controller runs other keys meanwhile. A
// lookup with no scripted response fails the case.
type scriptedLookups struct {
	lookups   []Lookup
	whole     []string // the canonical request of a lookup matched on the whole request
	endpoints []string
	wg        sync.WaitGroup
	mu        sync.Mutex
	err       error
}

func newScriptedLookups(lookups []Lookup, endpoints []string) *scriptedLookups {
	s := &scriptedLookups{lookups: lookups, endpoints: endpoints, whole: make([]string, len(lookups))}
	for i, l := range lookups {
		if strings.Contains(l.Request, "\n") {
			s.whole[i] = canonicalRequest(l.Request)
		}
	}
	return s
}

func (s *scriptedLookups) error() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *scriptedLookups) do(ctx context.Context, endpoint uint32, request []byte, done func(int, []byte, error)) {
	line, _, _ := strings.Cut(string(request), "\n")
	line = strings.TrimSuffix(line, "\r")
	name := ""
	if int(endpoint) < len(s.endpoints) {
		name = s.endpoints[endpoint]
	}
	var l *Lookup
	whole := ""
	for i := range s.lookups {
		if e := s.lookups[i].Endpoint; e != "" && e != name {
			continue
		}
		if s.whole[i] != "" {
			if whole == "" {
				whole = canonicalRequest(string(request))
			}
			if s.whole[i] != whole {
				continue
			}
		} else if s.lookups[i].Request != line {
			continue
		}
		l = &s.lookups[i]
		break
	}
	if l == nil {
		s.mu.Lock()
		if s.err == nil {
			s.err = fmt.Errorf("lookup %q on endpoint %q has no scripted response in the case's \"lookups\"", line, name)
		}
		s.mu.Unlock()
		done(0, nil, abi.LookupUnavailable)
		return
	}
	answer := func() {
		if l.Error != "" {
			done(0, nil, lookupCodes[l.Error])
			return
		}
		status := l.Status
		if status == 0 {
			status = 200
		}
		done(status, []byte(l.Body), nil)
	}
	if l.LatencyMS == 0 {
		answer()
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTimer(time.Duration(l.LatencyMS) * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
			answer()
		case <-ctx.Done():
			done(0, nil, abi.LookupCancelled)
		}
	}()
}

var lookupCodes = map[string]abi.Code{
	"LOOKUP_TIMEOUT": abi.LookupTimeout, "LOOKUP_BREAKER_OPEN": abi.LookupBreakerOpen,
	"LOOKUP_RESPONSE_TOO_LARGE": abi.LookupResponseTooLarge, "LOOKUP_REFUSED": abi.LookupRefused,
	"LOOKUP_UNAVAILABLE": abi.LookupUnavailable, "LOOKUP_CANCELLED": abi.LookupCancelled,
}

// diffOutputs compares outputs in order. An expected JSON string is compared with the output's
// raw bytes; any other expected value with the output as compact JSON. Each difference gives a
// "- want" and a "+ got" line.
func diffOutputs(label string, want []json.RawMessage, got [][]byte) []string {
	compact := func(b []byte) string {
		var c bytes.Buffer
		if json.Compact(&c, b) == nil {
			return c.String()
		}
		return string(b)
	}
	var out []string
	for i := range max(len(want), len(got)) {
		var w, g string
		raw := false
		if i < len(want) {
			if json.Unmarshal(want[i], &w) == nil {
				raw = true
			} else {
				w = compact(want[i])
			}
		}
		if i < len(got) {
			if raw {
				g = string(got[i])
			} else {
				g = compact(got[i])
			}
		}
		switch {
		case i >= len(got):
			out = append(out, fmt.Sprintf("  output %d: - %s", i+1, w))
		case i >= len(want):
			out = append(out, fmt.Sprintf("  output %d: + %s", i+1, g))
		case w != g:
			out = append(out, fmt.Sprintf("  output %d: - %s", i+1, w), fmt.Sprintf("  output %d: + %s", i+1, g))
		}
	}
	if len(out) == 0 {
		return nil
	}
	return append([]string{fmt.Sprintf("%s (%d, want %d):", label, len(got), len(want))}, out...)
}

// fieldKey takes the key from a top-level field of a JSON object: a string's text, any other
// scalar as written (docs/abi.md, "Model").
func fieldKey(value []byte, field string) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(value, &obj); err != nil {
		return nil, errors.New("value is not a JSON object")
	}
	raw, ok := obj[field]
	if !ok || string(raw) == "null" || raw[0] == '{' || raw[0] == '[' {
		return nil, fmt.Errorf("no scalar field %q", field)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []byte(s), nil
	}
	return raw, nil
}
