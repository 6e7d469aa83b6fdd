package devkit

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/replay"
)

// FromRecording turns the complete recording in dir (host/replay, docs/recording.md) into a
// test table: one case per record key, in the order keys first appear, with the key's records
// and the watermarks among them, the state values the run was served for the key before it
// wrote them, and the outputs of the key's records and timers, compared in order
// (outputs_by_key). Records keyed by the module (no key field) all go in one case, since their
// keys are known only once the module ran. Lookups cannot be attributed to a key at the host's
// seams: the table's shared "lookups" hold the first recorded response of each distinct request,
// matched on the whole request.
func FromRecording(dir string) (*Table, error) {
	man, err := replay.ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	if man.Status != replay.StatusComplete {
		return nil, fmt.Errorf("%w: %s is %s; turn a complete recording into test cases", replay.ErrNotReplayable, dir, man.Status)
	}
	const byModule = "\x00module"
	type acc struct {
		c    Case
		outs map[string][]json.RawMessage
	}
	var order []*acc
	byKey := map[string]*acc{}
	var wms []Step
	get := func(key []byte, module bool) (*acc, error) {
		k := string(key)
		if module {
			k = byModule
		}
		if a := byKey[k]; a != nil {
			return a, nil
		}
		if !module && !utf8.Valid(key) {
			return nil, fmt.Errorf("record key %x is not UTF-8 text, which a test table cannot hold", key)
		}
		a := &acc{outs: map[string][]json.RawMessage{}}
		a.c.Name = fmt.Sprintf("key %q", key)
		if module {
			a.c.Name = "records keyed by the module"
		}
		// Watermarks seen before the key's first record still matter to its timers; only the
		// last of them does.
		if n := len(wms); n > 0 {
			a.c.Input = append(a.c.Input, wms[n-1])
		}
		byKey[k] = a
		order = append(order, a)
		return a, nil
	}
	err = replay.ReadFile(dir, replay.InputFile, func(_ int64, e *replay.Element) error {
		if e.Kind == replay.KindWatermark {
			ts := e.TS
			w := Step{Watermark: &ts}
			wms = append(wms, w)
			for _, a := range order {
				a.c.Input = append(a.c.Input, w)
			}
			return nil
		}
		a, err := get(e.Key, e.KeyByModule)
		if err != nil {
			return err
		}
		s := Step{Ts: e.TS, KeyByModule: e.KeyByModule}
		if !e.KeyByModule {
			k := string(e.Key)
			s.Key = &k
		}
		if utf8.Valid(e.Value) {
			s.Value = textJSON(e.Value)
		} else {
			s.ValueHex = hex.EncodeToString(e.Value)
		}
		a.c.Input = append(a.c.Input, s)
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Initial state: the values the run was served before it wrote the key.
	seen := map[string]bool{}
	err = replay.ReadFile(dir, replay.StateFile, func(_ int64, op *replay.StateOp) error {
		if op.Op == replay.OpOperatorState {
			return nil
		}
		k := fmt.Sprintf("%q/%q/%q", op.State, op.Key, op.Entry)
		if seen[k] {
			return nil
		}
		seen[k] = true
		if op.Op != replay.OpGet || !op.Found {
			return nil
		}
		a := byKey[string(op.Key)]
		if a == nil {
			a = byKey[byModule]
		}
		if a == nil {
			return nil
		}
		if !utf8.Valid(op.Key) || !utf8.Valid(op.Entry) {
			return fmt.Errorf("state %q: key %x entry %x is not UTF-8 text, which a test table cannot hold", op.State, op.Key, op.Entry)
		}
		if a.c.State == nil {
			a.c.State = StateMap{}
		}
		key := string(op.Key)
		if a.c.State[key] == nil {
			a.c.State[key] = map[string]map[string]*Value{}
		}
		if a.c.State[key][op.State] == nil {
			a.c.State[key][op.State] = map[string]*Value{}
		}
		a.c.State[key][op.State][string(op.Entry)] = NewValue(op.Value)
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Expected outputs, by the key of the record or timer that produced them. What clink_open
	// and clink_close emitted belongs to no case.
	err = replay.ReadFile(dir, replay.OutputFile, func(_ int64, o *replay.Output) error {
		if o.Src == nil {
			return nil
		}
		a := byKey[string(o.Src.Key)]
		if a == nil {
			a = byKey[byModule]
		}
		if a == nil {
			return nil
		}
		if !utf8.Valid(o.Value) {
			return fmt.Errorf("an output of key %q is not UTF-8 text (%x), which a test table cannot hold", o.Src.Key, o.Value)
		}
		a.outs[string(o.Src.Key)] = append(a.outs[string(o.Src.Key)], textJSON(o.Value))
		return nil
	})
	if err != nil {
		return nil, err
	}
	t := &Table{}
	reqs := map[string]bool{}
	err = replay.ReadFile(dir, replay.LookupFile, func(_ int64, l *replay.Lookup) error {
		k := l.Endpoint + "\x00" + canonicalRequest(string(l.Request))
		if reqs[k] {
			return nil
		}
		reqs[k] = true
		if !utf8.Valid(l.Request) || !utf8.Valid(l.Body) {
			return fmt.Errorf("lookup %q on %q: the request or body is not UTF-8 text, which a test table cannot hold", l.Request, l.Endpoint)
		}
		if strings.HasPrefix(l.Error, "fatal: ") {
			return fmt.Errorf("lookup %q on %q failed the recorded run (%s)", l.Request, l.Endpoint, l.Error)
		}
		if _, ok := lookupCodes[l.Error]; l.Error != "" && !ok {
			return fmt.Errorf("lookup %q on %q: error %q has no test table name", l.Request, l.Endpoint, l.Error)
		}
		t.Lookups = append(t.Lookups, Lookup{Endpoint: l.Endpoint, Request: string(l.Request), Status: l.Status, Body: string(l.Body), Error: l.Error})
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, a := range order {
		a.c.Expect.OutputsByKey = a.outs
		if _, ok := byKey[byModule]; !ok || a != byKey[byModule] {
			// Each key is listed, also with no output: the key must emit nothing.
			for _, s := range a.c.Input {
				if s.Key != nil && a.outs[*s.Key] == nil {
					a.outs[*s.Key] = []json.RawMessage{}
				}
			}
		}
		t.Cases = append(t.Cases, a.c)
	}
	if len(t.Cases) == 0 {
		return nil, errors.New(dir + " holds no records to make test cases of")
	}
	return t, nil
}

// textJSON writes bytes that are UTF-8 text as a table value: as JSON when they are compact
// JSON (readable, and what the runner compares outputs as), else as a JSON string (the raw
// bytes).
func textJSON(b []byte) json.RawMessage {
	var c bytes.Buffer
	if json.Valid(b) && json.Compact(&c, b) == nil && bytes.Equal(c.Bytes(), b) && b[0] != '"' {
		return json.RawMessage(bytes.Clone(b))
	}
	s, _ := json.Marshal(string(b))
	return s
}

// canonicalRequest is a lookup request in the host's canonical form when it parses (so that
// "GET /x" and "GET /x\n\n" are one request), else as it is.
func canonicalRequest(s string) string {
	if r, err := lookup.ParseRequest([]byte(s)); err == nil {
		return string(r.AppendTo(nil))
	}
	return s
}
