package devkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// Table is a test table (tests.json).
type Table struct {
	Cases []Case `json:"cases"`
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
	// ("GET /geo?ip=1.2.3.4") and the endpoint name (any endpoint when empty). A lookup with
	// no matching entry fails the case.
	Lookups []Lookup `json:"lookups,omitempty"`
	Expect  Expect   `json:"expect"`
}

// A Step is a record, or a watermark when Watermark is set.
type Step struct {
	// Value is the record's value: a JSON object (or any JSON value) is used as its text; a
	// JSON string is used as the record's raw bytes.
	Value json.RawMessage `json:"value,omitempty"`
	// Key is the record key; when absent it is the value's top-level field named by the
	// project's key (clink.json "key", default "user"), as `clink-wasm run --key` takes it.
	Key *string `json:"key,omitempty"`
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
}

// Expect is what a case must produce. Outputs are compared in order, as compact JSON (a JSON
// string is compared with the raw output bytes); State lists entries that must hold these
// values at the end (null: absent); Error, when set, is a substring of the fault the case must
// end with.
type Expect struct {
	Outputs []json.RawMessage `json:"outputs"`
	State   StateMap          `json:"state,omitempty"`
	Error   string            `json:"error,omitempty"`
}

// StateMap is record key -> state name -> entry -> value.
type StateMap map[string]map[string]map[string]*Value

// Value is a state value in a test table: a JSON string (its bytes), or {"i64": N} (8 bytes,
// little-endian, what the SDKs' PutInt64 writes), or {"hex": "..."}.
type Value struct{ b []byte }

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
	h := *o.Hex
	if len(h)%2 != 0 {
		return fmt.Errorf("hex state value %q has an odd length", h)
	}
	for i := 0; i < len(h); i += 2 {
		n, err := strconv.ParseUint(h[i:i+2], 16, 8)
		if err != nil {
			return fmt.Errorf("hex state value %q: %w", h, err)
		}
		v.b = append(v.b, byte(n))
	}
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
}

// ErrFailed is returned by Test when a case failed.
var ErrFailed = errors.New("test cases failed")

// Test runs the project's tests.json against its built module in the production ABI host and
// writes one line per case to w, with a diff for each failure. It returns ErrFailed when a
// case failed.
func Test(ctx context.Context, dir string, w io.Writer) ([]CaseResult, error) {
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
	table, err := LoadTable(filepath.Join(dir, "tests.json"))
	if err != nil {
		return nil, err
	}
	return RunTable(ctx, bin, p.Key, table, w)
}

// RunTable runs every case of table against the module bin; keyField keys records that give no
// key of their own.
func RunTable(ctx context.Context, bin []byte, keyField string, table *Table, w io.Writer) ([]CaseResult, error) {
	eng, err := abi.NewEngine(ctx)
	if err != nil {
		return nil, err
	}
	defer eng.Close(ctx)
	m, err := eng.Load(ctx, bin, abi.LoadOptions{})
	if err != nil {
		return nil, err
	}
	var results []CaseResult
	failed := 0
	for i, c := range table.Cases {
		name := c.Name
		if name == "" {
			name = "case " + strconv.Itoa(i+1)
		}
		diff, err := runCase(ctx, m, keyField, &c)
		if err != nil {
			return results, fmt.Errorf("%s: %w", name, err)
		}
		results = append(results, CaseResult{Name: name, Diff: diff})
		if len(diff) == 0 {
			fmt.Fprintf(w, "ok    %s\n", name)
			continue
		}
		failed++
		fmt.Fprintf(w, "FAIL  %s\n", name)
		for _, d := range diff {
			fmt.Fprintf(w, "      %s\n", d)
		}
	}
	fmt.Fprintf(w, "%d of %d cases passed\n", len(table.Cases)-failed, len(table.Cases))
	if failed > 0 {
		return results, ErrFailed
	}
	return results, nil
}

// runCase runs one case and returns the differences from its expectation. The error is for a
// table that cannot be run (a malformed record, an unknown state).
func runCase(ctx context.Context, m *abi.Module, keyField string, c *Case) ([]string, error) {
	states := map[string]uint32{}
	for i, s := range m.Manifest.States {
		states[s] = uint32(i)
	}
	h := &handler{state: map[string][]byte{}, timers: map[string]map[int64]bool{}, watermark: math.MinInt64,
		lookups: c.Lookups, endpoints: m.Manifest.Endpoints}
	for key, byState := range c.State {
		for name, entries := range byState {
			id, ok := states[name]
			if !ok {
				return nil, fmt.Errorf("initial state names %q, which the module does not declare (it declares %v)", name, m.Manifest.States)
			}
			for entry, v := range entries {
				if v != nil {
					h.state[skey(key, id, entry)] = v.b
				}
			}
		}
	}
	in, err := m.Instantiate(ctx, h)
	if err != nil {
		return []string{"instantiate: " + err.Error()}, nil
	}
	defer in.Close(context.WithoutCancel(ctx))

	var runErr error
	for i, s := range c.Input {
		if s.Watermark != nil {
			if runErr = h.advance(in, *s.Watermark); runErr != nil {
				break
			}
			continue
		}
		var value []byte
		var str string
		if json.Unmarshal(s.Value, &str) == nil {
			value = []byte(str)
		} else {
			var b bytes.Buffer
			if err := json.Compact(&b, s.Value); err != nil {
				return nil, fmt.Errorf("input %d: value is not JSON: %w", i+1, err)
			}
			value = b.Bytes()
		}
		var key []byte
		if s.Key != nil {
			key = []byte(*s.Key)
		} else if key, err = fieldKey(value, keyField); err != nil {
			return nil, fmt.Errorf("input %d: %w (give \"key\" or a %q field)", i+1, err, keyField)
		}
		h.key = string(key)
		if runErr = in.Process(key, value, s.Ts); runErr != nil {
			runErr = fmt.Errorf("input %d (key %q): %w", i+1, key, runErr)
			break
		}
	}
	if runErr == nil && h.err == nil {
		h.key = ""
		runErr = in.Close(ctx)
	}
	if h.err != nil {
		runErr = h.err
	}

	var diff []string
	switch {
	case c.Expect.Error == "" && runErr != nil:
		diff = append(diff, "error: "+runErr.Error())
	case c.Expect.Error != "" && runErr == nil:
		diff = append(diff, fmt.Sprintf("error: none, want one containing %q", c.Expect.Error))
	case c.Expect.Error != "" && !strings.Contains(runErr.Error(), c.Expect.Error):
		diff = append(diff, fmt.Sprintf("error: %v, want one containing %q", runErr, c.Expect.Error))
	}
	diff = append(diff, diffOutputs(c.Expect.Outputs, h.out)...)
	var stateDiff []string
	for key, byState := range c.Expect.State {
		for name, entries := range byState {
			id, ok := states[name]
			if !ok {
				return nil, fmt.Errorf("expected state names %q, which the module does not declare", name)
			}
			for entry, want := range entries {
				got, found := h.state[skey(key, id, entry)]
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
	return append(diff, stateDiff...), nil
}

// diffOutputs compares outputs in order. An expected JSON string is compared with the output's
// raw bytes; any other expected value with the output as compact JSON. Each difference gives a
// "- want" and a "+ got" line.
func diffOutputs(want []json.RawMessage, got [][]byte) []string {
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
	return append([]string{fmt.Sprintf("outputs (%d, want %d):", len(got), len(want))}, out...)
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

func skey(key string, state uint32, entry string) string {
	return strconv.Itoa(len(key)) + ":" + key + "/" + strconv.FormatUint(uint64(state), 10) + "/" + entry
}

// handler serves the imports for one case: keyed state in a map, timers, scripted lookups.
type handler struct {
	key       string
	state     map[string][]byte
	timers    map[string]map[int64]bool
	watermark int64
	out       [][]byte
	lookups   []Lookup
	endpoints []string
	err       error // a table error found during a call (an unscripted lookup)
}

func (h *handler) Get(state uint32, entry []byte) ([]byte, bool, error) {
	v, ok := h.state[skey(h.key, state, string(entry))]
	return v, ok, nil
}

func (h *handler) Put(state uint32, entry, value []byte) error {
	h.state[skey(h.key, state, string(entry))] = bytes.Clone(value)
	return nil
}

func (h *handler) Delete(state uint32, entry []byte) error {
	delete(h.state, skey(h.key, state, string(entry)))
	return nil
}

func (h *handler) Emit(_, value []byte) error {
	h.out = append(h.out, bytes.Clone(value))
	return nil
}

func (h *handler) RegisterTimer(ts int64) error {
	if h.timers[h.key] == nil {
		h.timers[h.key] = map[int64]bool{}
	}
	h.timers[h.key][ts] = true
	return nil
}

func (h *handler) DeleteTimer(ts int64) error {
	delete(h.timers[h.key], ts)
	return nil
}

func (h *handler) Watermark() int64 { return h.watermark }

var lookupCodes = map[string]abi.Code{
	"LOOKUP_TIMEOUT": abi.LookupTimeout, "LOOKUP_BREAKER_OPEN": abi.LookupBreakerOpen,
	"LOOKUP_RESPONSE_TOO_LARGE": abi.LookupResponseTooLarge, "LOOKUP_REFUSED": abi.LookupRefused,
	"LOOKUP_UNAVAILABLE": abi.LookupUnavailable, "LOOKUP_CANCELLED": abi.LookupCancelled,
}

func (h *handler) Lookup(endpoint uint32, request []byte) (int, []byte, error) {
	line, _, _ := strings.Cut(string(request), "\n")
	name := ""
	if int(endpoint) < len(h.endpoints) {
		name = h.endpoints[endpoint]
	}
	for _, l := range h.lookups {
		if l.Request != line || (l.Endpoint != "" && l.Endpoint != name) {
			continue
		}
		if l.Error != "" {
			code, ok := lookupCodes[l.Error]
			if !ok {
				h.err = fmt.Errorf("lookup %q: unknown error %q (want a LOOKUP_* code name)", line, l.Error)
				return 0, nil, abi.LookupUnavailable
			}
			return 0, nil, code
		}
		status := l.Status
		if status == 0 {
			status = 200
		}
		return status, []byte(l.Body), nil
	}
	if h.err == nil {
		h.err = fmt.Errorf("lookup %q on endpoint %q has no scripted response in the case's \"lookups\"", line, name)
	}
	return 0, nil, abi.LookupUnavailable
}

func (h *handler) Log(abi.LogLevel, []byte) {}

func (h *handler) SetResumeOrder(int64) {}

// advance moves the watermark and fires the due timers in (timestamp, key) order.
func (h *handler) advance(in *abi.Instance, wm int64) error {
	h.watermark = max(h.watermark, wm)
	type due struct {
		key string
		ts  int64
	}
	var fire []due
	for k, ts := range h.timers {
		for t := range ts {
			if t <= h.watermark {
				fire = append(fire, due{k, t})
			}
		}
	}
	slices.SortFunc(fire, func(a, b due) int {
		if a.ts != b.ts {
			if a.ts < b.ts {
				return -1
			}
			return 1
		}
		return strings.Compare(a.key, b.key)
	})
	for _, d := range fire {
		delete(h.timers[d.key], d.ts)
		h.key = d.key
		if err := in.OnTimer([]byte(d.key), d.ts); err != nil {
			return fmt.Errorf("timer %d of key %q: %w", d.ts, d.key, err)
		}
	}
	return nil
}
