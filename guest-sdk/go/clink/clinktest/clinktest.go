//go:build !wasip1

// Package clinktest runs a clink operator natively, in the test binary, against an in-memory
// host that follows docs/abi.md: keyed state, emits, event-time timers, the watermark,
// lookups answered by a function, and logs.
//
// The operator is whatever the package under test registered with clink.Register in its init
// functions, so a test in the operator's own package main is enough:
//
//	func TestCounter(t *testing.T) {
//		h, err := clinktest.New()
//		...
//		out, err := h.Process([]byte("alice"), []byte(`{"user":"alice"}`), 0)
//	}
//
// It is a unit-test aid, not the production host: it has no limits, no suspension, no
// sandbox, and it runs every record on the same instance.
package clinktest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/ptimer"
)

// Output is an emitted record.
type Output struct {
	Key, Value []byte
	Timestamp  int64
}

// LogLine is a line the operator logged; Level is 0 debug, 1 info, 2 warn, 3 error.
type LogLine struct {
	Level int
	Msg   string
}

// Manifest is the operator's declared manifest.
type Manifest struct {
	ABI       int      `json:"abi"`
	Name      string   `json:"name"`
	States    []string `json:"states"`
	Prefetch  []string `json:"prefetch,omitempty"`
	Endpoints []string `json:"endpoints"`
}

// LookupFunc answers the operator's lookups. request is the raw request text
// (docs/abi.md, "Lookup request format"). Return a status > 0 and a body, or an error
// matching one of the clink.ErrLookup* sentinels (another error is reported as
// LOOKUP_UNAVAILABLE).
type LookupFunc func(endpoint string, request []byte) (status int, body []byte, err error)

// Harness is one instance of the operator with its own in-memory host.
type Harness struct {
	host     *abi.NativeHost
	manifest Manifest
	lookup   LookupFunc
}

// FaultError is a non-zero return (a returned error or a recovered panic) from the operator.
type FaultError struct {
	Export  string // "clink_process", "clink_on_timer", ...
	Code    int32
	Message string // the last error-level log line of the call
}

func (e *FaultError) Error() string {
	return fmt.Sprintf("%s returned %d: %s", e.Export, e.Code, e.Message)
}

// New resets the in-memory host, reads the operator's manifest and runs its Open.
func New() (*Harness, error) {
	if abi.Exports.Manifest == nil {
		return nil, errors.New("clinktest: the clink package is not initialised")
	}
	h := &Harness{host: abi.NewNativeHost()}
	abi.Host = h.host
	abi.Exports.Reset()
	abi.NativeProcessingTime = 0

	var m []byte
	if err := h.call(abi.CallManifest, "clink_manifest", func() int32 { m = abi.Exports.Manifest(); return 0 }); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(m, &h.manifest); err != nil {
		return nil, fmt.Errorf("clinktest: malformed manifest %q: %w", m, err)
	}
	if h.manifest.ABI != abi.Version {
		return nil, fmt.Errorf("clinktest: manifest declares ABI %d, want %d", h.manifest.ABI, abi.Version)
	}
	h.host.NumStates, h.host.NumEndpoints = len(h.manifest.States), len(h.manifest.Endpoints)
	for _, p := range h.manifest.Prefetch {
		i := slices.Index(h.manifest.States, p)
		if i < 0 {
			return nil, fmt.Errorf("clinktest: manifest prefetches %q, which is not among its states", p)
		}
		h.host.Prefetch = append(h.host.Prefetch, uint32(i))
	}
	h.host.Lookups = h.serveLookup
	if err := h.call(abi.CallOpen, "clink_open", abi.Exports.Open); err != nil {
		return nil, err
	}
	return h, nil
}

// Manifest returns the operator's manifest.
func (h *Harness) Manifest() Manifest { return h.manifest }

// SetLookup installs the function that answers lookups. Without one, every lookup fails with
// LOOKUP_UNAVAILABLE.
func (h *Harness) SetLookup(f LookupFunc) { h.lookup = f }

// SetProcessingTime sets what clink.ProcessingTime returns.
func (h *Harness) SetProcessingTime(ms int64) { abi.NativeProcessingTime = ms }

// Watermark returns the current watermark.
func (h *Harness) Watermark() int64 { return h.host.WatermarkValue }

// Logs returns every line logged so far.
func (h *Harness) Logs() []LogLine {
	out := make([]LogLine, len(h.host.Logs))
	for i, l := range h.host.Logs {
		out[i] = LogLine{Level: int(l.Level), Msg: l.Msg}
	}
	return out
}

// State returns the value of entry in state for record key, as the host stores it.
func (h *Harness) State(key []byte, state string, entry []byte) (value []byte, found bool) {
	i := slices.Index(h.manifest.States, state)
	s := h.host.State[string(key)]
	if i < 0 || s == nil || s[i] == nil {
		return nil, false
	}
	v, found := s[i][string(entry)]
	return v, found
}

// Process runs one record through the operator and returns what it emitted.
func (h *Harness) Process(key, value []byte, timestamp int64) ([]Output, error) {
	h.host.Key, h.host.Timestamp = string(key), timestamp
	frames, caps := h.writeInput(uint32(len(key)+len(value)), key, value)
	return h.collect(abi.CallProcess, "clink_process", frames, caps, func() int32 {
		return abi.Exports.Process(uint32(len(key)), uint32(len(value)), timestamp)
	})
}

// MaxBatch is the most records ProcessBatch takes in one call, as docs/abi.md allows.
const MaxBatch = 256

// ProcessBatch runs recs, whose keys must be distinct, through one clink_process_batch call,
// laid out as the host lays out a batch (docs/abi.md, "Batch calls": a header, a descriptor
// per record, then each record with its own prefetch frames), and returns each record's
// outputs. The operator still sees one Process per record; this is the export the host's
// scheduler uses when records of several free keys wait, so a benchmark that profiles it
// covers the SDK's batch loop. When a record fails, the records before it are complete
// (their outputs returned, their state written) and the error is the failed record's.
func (h *Harness) ProcessBatch(recs []clink.Record) ([][]Output, error) {
	n := len(recs)
	if n == 0 || n > MaxBatch {
		return nil, fmt.Errorf("clinktest: a batch of %d records, want 1 to %d", n, MaxBatch)
	}
	b := &abi.NativeBatch{Keys: make([]string, n), TS: make([]int64, n)}
	type placed struct {
		off, frames uint32
		f           []byte
		caps        []uint32
	}
	at := make([]placed, n)
	total := uint32(abi.BatchHeader + abi.BatchDesc*n)
	for i, r := range recs {
		k := string(r.Key)
		if slices.Contains(b.Keys[:i], k) {
			return nil, fmt.Errorf("clinktest: key %q twice in one batch", r.Key)
		}
		b.Keys[i], b.TS[i] = k, r.Timestamp
		h.host.Key = k
		p := &at[i]
		p.f, p.caps = h.host.Frames()
		p.off = abi.Align8(total)
		p.frames = p.off + abi.Align8(uint32(len(r.Key)+len(r.Value)))
		total = p.frames + uint32(len(p.f))
	}
	abi.GrowInput(total)
	in := abi.Input
	clear(in[:abi.BatchHeader+abi.BatchDesc*n])
	abi.PutLe32(in, uint32(n))
	for i, r := range recs {
		p := &at[i]
		d := in[abi.BatchHeader+abi.BatchDesc*i:]
		abi.PutLe32(d[abi.DescOffset:], p.off)
		abi.PutLe32(d[abi.DescKeyLen:], uint32(len(r.Key)))
		abi.PutLe32(d[abi.DescValueLen:], uint32(len(r.Value)))
		abi.PutLe32(d[abi.DescTS:], uint32(r.Timestamp))
		abi.PutLe32(d[abi.DescTS+4:], uint32(uint64(r.Timestamp)>>32))
		copy(in[p.off+uint32(copy(in[p.off:], r.Key)):], r.Value)
		copy(in[p.frames:], p.f)
	}
	h.host.Batch = b
	h.host.Key, h.host.Timestamp = b.Keys[0], b.TS[0]
	h.host.Outputs = nil
	err := h.call(abi.CallProcess, "clink_process_batch", func() int32 { return abi.Exports.ProcessBatch(uint32(n)) })
	// Complete the records that succeeded, in order: all of them, or those before the one
	// that failed (the header's current).
	done := n
	if err != nil {
		done = min(int(abi.Le32(in[4:])), n)
	}
	h.host.DrainBatch(done)
	if err == nil && h.host.AreaUsed() != b.Pos {
		h.host.Fault("output area: records past the last batch record's out_end")
	}
	h.host.DiscardOutput()
	for j := range done {
		h.host.Key = b.Keys[j]
		if p := &at[j]; len(p.f) > 0 {
			h.host.WriteBack(in[p.frames:p.frames+uint32(len(p.f))], p.caps)
		}
	}
	h.host.Batch = nil
	if msg := h.host.TakeFault(); msg != "" && err == nil {
		err = &FaultError{Export: "clink_process_batch", Message: "host: " + msg}
	}
	out := make([][]Output, done)
	for _, o := range h.host.Outputs {
		if o.Rec < done {
			out[o.Rec] = append(out[o.Rec], Output{Key: o.Key, Value: o.Value, Timestamp: o.Timestamp})
		}
	}
	h.host.Outputs = nil
	return out, err
}

// writeInput writes the record (parts, n bytes in all) and, after it, the prefetch frames of
// the current key into the input buffer, as the host does (docs/abi.md, "Prefetched values").
// It returns the frames' place in the input buffer and their caps.
func (h *Harness) writeInput(n uint32, parts ...[]byte) (frames []byte, caps []uint32) {
	f, caps := h.host.Frames()
	off := abi.Align8(n)
	abi.GrowInput(off + uint32(len(f)))
	p := 0
	for _, b := range parts {
		p += copy(abi.Input[p:], b)
	}
	copy(abi.Input[off:], f)
	return abi.Input[off : off+uint32(len(f))], caps
}

// AdvanceWatermark moves the watermark to wm (it never moves backwards) and fires every timer
// at or before it, in timestamp order (then key order), returning what they emitted.
func (h *Harness) AdvanceWatermark(wm int64) ([]Output, error) {
	if wm > h.host.WatermarkValue {
		h.host.WatermarkValue = wm
	}
	type due struct {
		key string
		ts  int64
	}
	var fire []due
	for k, ts := range h.host.Timers {
		for t := range ts {
			if t <= h.host.WatermarkValue {
				fire = append(fire, due{k, t})
			}
		}
	}
	slices.SortFunc(fire, func(a, b due) int {
		if a.ts != b.ts {
			return cmpInt(a.ts, b.ts)
		}
		return bytes.Compare([]byte(a.key), []byte(b.key))
	})
	var out []Output
	for _, d := range fire {
		delete(h.host.Timers[d.key], d.ts)
		h.host.Key, h.host.Timestamp = d.key, d.ts
		frames, caps := h.writeInput(uint32(len(d.key)), []byte(d.key))
		o, err := h.collect(abi.CallTimer, "clink_on_timer", frames, caps, func() int32 {
			return abi.Exports.OnTimer(uint32(len(d.key)), d.ts)
		})
		out = append(out, o...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// AdvanceProcessingTime sets the processing time (clink.ProcessingTime) to now and fires
// every processing-time timer (package ptimer) at or before it, in timestamp order (then key order), returning
// what they emitted. The clock never moves backwards.
func (h *Harness) AdvanceProcessingTime(now int64) ([]Output, error) {
	if now > abi.NativeProcessingTime {
		abi.NativeProcessingTime = now
	}
	type due struct {
		key string
		ts  int64
	}
	var fire []due
	for k, ts := range h.host.ProcTimers {
		for t := range ts {
			if t <= abi.NativeProcessingTime {
				fire = append(fire, due{k, t})
			}
		}
	}
	slices.SortFunc(fire, func(a, b due) int {
		if a.ts != b.ts {
			return cmpInt(a.ts, b.ts)
		}
		return bytes.Compare([]byte(a.key), []byte(b.key))
	})
	var out []Output
	for _, d := range fire {
		delete(h.host.ProcTimers[d.key], d.ts)
		h.host.Key, h.host.Timestamp = d.key, d.ts
		frames, caps := h.writeInput(uint32(len(d.key)), []byte(d.key))
		o, err := h.collect(abi.CallTimer, "clink_on_processing_timer", frames, caps, func() int32 {
			return ptimer.Fire(uint32(len(d.key)), d.ts)
		})
		out = append(out, o...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// Close fires every remaining timer (the watermark goes to its end-of-input value) and runs
// the operator's Close, returning what they emitted.
func (h *Harness) Close() ([]Output, error) {
	out, err := h.AdvanceWatermark(math.MaxInt64)
	if err != nil {
		return out, err
	}
	h.host.Key, h.host.Timestamp = "", 0
	o, err := h.collect(abi.CallClose, "clink_close", nil, nil, abi.Exports.Close)
	return append(out, o...), err
}

// collect runs an export that may emit. When it succeeds, the host drains the output area and
// then writes back the DIRTY frames (in frames, a view of the input buffer, with their caps),
// as docs/abi.md orders them; when it fails, the undrained records are discarded.
func (h *Harness) collect(c abi.Call, export string, frames []byte, caps []uint32, f func() int32) ([]Output, error) {
	h.host.Outputs = nil
	err := h.call(c, export, f)
	if err != nil {
		h.host.DiscardOutput()
	} else {
		h.host.Drain()
		if len(frames) > 0 {
			h.host.WriteBack(frames, caps)
		}
		if msg := h.host.TakeFault(); msg != "" {
			err = &FaultError{Export: export, Message: "host: " + msg}
		}
	}
	out := make([]Output, len(h.host.Outputs))
	for i, o := range h.host.Outputs {
		out[i] = Output{Key: o.Key, Value: o.Value, Timestamp: o.Timestamp}
	}
	h.host.Outputs = nil
	return out, err
}

func (h *Harness) call(c abi.Call, export string, f func() int32) error {
	h.host.Call = c
	first := len(h.host.Logs)
	rc := f()
	h.host.Call = abi.CallNone
	if rc == 0 {
		return nil
	}
	e := &FaultError{Export: export, Code: rc}
	for _, l := range h.host.Logs[first:] {
		if l.Level >= 3 {
			e.Message = l.Msg
		}
	}
	return e
}

func (h *Harness) serveLookup(endpoint int, req []byte) (int, []byte, int32) {
	if h.lookup == nil {
		return 0, nil, abi.LookupUnavailable
	}
	status, body, err := h.lookup(h.manifest.Endpoints[endpoint], req)
	if err != nil {
		var ce *clink.Error
		if errors.As(err, &ce) && ce.Code < 0 {
			return 0, nil, int32(ce.Code)
		}
		return 0, nil, abi.LookupUnavailable
	}
	if status <= 0 {
		return 0, nil, abi.LookupUnavailable
	}
	return status, body, 0
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
