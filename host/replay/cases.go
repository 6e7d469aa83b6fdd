package replay

import (
	"fmt"
	"slices"
)

// CasesFormat and CasesVersion identify a cases file written by [Cases] (docs/recording.md,
// "Test cases from a recording"). The `clink-wasm test` table format is being designed
// separately; this one is to be reconciled with it.
const (
	CasesFormat  = "clink-test-cases"
	CasesVersion = 1
)

// CaseFile is a recording turned into test cases: one case per record key, in the order keys
// first appear. Lookups are shared by every case (a lookup cannot be attributed to a key at
// the host's seams): the first recorded response of each distinct request.
type CaseFile struct {
	Format    string       `json:"format"`
	Version   int          `json:"version"`
	Recording string       `json:"recording"`
	Operator  string       `json:"operator"`
	KeyField  string       `json:"key_field,omitempty"`
	Lookups   []CaseLookup `json:"lookups,omitempty"`
	Cases     []Case       `json:"cases"`
}

// Case is one key's records (with the watermarks between them), the state it started with and
// the outputs it produced, records' and timers' alike, in order.
type Case struct {
	Name   string      `json:"name"`
	Input  []CaseInput `json:"input"`
	State  []CaseState `json:"state,omitempty"`
	Expect []OutValue  `json:"expect"`
}

// CaseInput is a record (Key, Value, TS) or a watermark (Watermark set).
type CaseInput struct {
	Key       Bytes `json:"key,omitempty"`
	Value     Bytes `json:"value,omitempty"`
	TS        int64 `json:"ts"`
	Watermark bool  `json:"watermark,omitempty"`
	Pos       int64 `json:"pos,omitempty"` // where it was in the recorded input
}

// CaseState is an initial state value.
type CaseState struct {
	State string `json:"state"`
	Entry Bytes  `json:"entry,omitempty"`
	Value Bytes  `json:"value"`
}

// CaseLookup is a scripted lookup response.
type CaseLookup struct {
	Endpoint string `json:"endpoint"`
	Request  Bytes  `json:"request"`
	Status   int    `json:"status,omitempty"`
	Body     Bytes  `json:"body,omitempty"`
	Error    string `json:"error,omitempty"`
}

// Cases turns the complete recording in dir into test cases. Records keyed by the module
// (no key field) all go in one case, since their keys are known only once the module ran.
func Cases(dir string) (*CaseFile, error) {
	man, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	if man.Status != StatusComplete {
		return nil, fmt.Errorf("%w: %s is %s; turn a complete recording into cases", ErrNotReplayable, dir, man.Status)
	}
	cf := &CaseFile{Format: CasesFormat, Version: CasesVersion, Recording: dir, Operator: man.Operator, KeyField: man.KeyField}
	type acc struct {
		c   Case
		key []byte
	}
	var order []*acc
	byKey := map[string]*acc{}
	var wms []CaseInput
	get := func(key []byte, byModule bool) *acc {
		k := string(key)
		if byModule {
			k = "\x00module"
		}
		a := byKey[k]
		if a == nil {
			a = &acc{key: key}
			a.c.Name = fmt.Sprintf("key %q", key)
			if byModule {
				a.c.Name = "records keyed by the module"
			}
			// Watermarks seen before the key's first record still matter to its timers.
			a.c.Input = append(a.c.Input, wms...)
			byKey[k] = a
			order = append(order, a)
		}
		return a
	}
	err = ReadFile(dir, InputFile, func(_ int64, e *Element) error {
		if e.Kind == KindWatermark {
			w := CaseInput{TS: e.TS, Watermark: true}
			wms = append(wms, w)
			for _, a := range order {
				a.c.Input = append(a.c.Input, w)
			}
			return nil
		}
		a := get(e.Key, e.KeyByModule)
		a.c.Input = append(a.c.Input, CaseInput{Key: e.Key, Value: e.Value, TS: e.TS, Pos: e.Pos})
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Initial state: the values the run was served before it wrote the key.
	seen := map[string]bool{}
	err = ReadFile(dir, StateFile, func(_ int64, op *StateOp) error {
		if op.Op == OpOperatorState {
			return nil
		}
		k := stateKey(op.State, op.Key, op.Entry)
		if seen[k] {
			return nil
		}
		seen[k] = true
		if op.Op != OpGet || !op.Found {
			return nil
		}
		if a := byKey[string(op.Key)]; a != nil {
			a.c.State = append(a.c.State, CaseState{State: op.State, Entry: op.Entry, Value: op.Value})
		} else if a := byKey["\x00module"]; a != nil {
			a.c.State = append(a.c.State, CaseState{State: op.State, Entry: op.Entry, Value: op.Value})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Expected outputs, by the key of the record or timer that produced them.
	err = ReadFile(dir, OutputFile, func(_ int64, o *Output) error {
		var a *acc
		if o.Src != nil {
			a = byKey[string(o.Src.Key)]
		}
		if a == nil {
			a = byKey["\x00module"]
		}
		if a == nil {
			return nil // clink_open / clink_close output: no case owns it
		}
		a.c.Expect = append(a.c.Expect, OutValue{Key: o.Key, Value: o.Value, TS: o.TS})
		return nil
	})
	if err != nil {
		return nil, err
	}
	reqs := map[string]bool{}
	err = ReadFile(dir, LookupFile, func(_ int64, l *Lookup) error {
		k := requestKey(l.Endpoint, l.Request)
		if reqs[k] {
			return nil
		}
		reqs[k] = true
		cf.Lookups = append(cf.Lookups, CaseLookup{Endpoint: l.Endpoint, Request: l.Request, Status: l.Status, Body: l.Body, Error: l.Error})
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, a := range order {
		// A case ends with its last record or the watermark after it; trailing watermarks
		// beyond the final one add nothing.
		a.c.Input = trimWatermarks(a.c.Input)
		if a.c.Expect == nil {
			a.c.Expect = []OutValue{}
		}
		cf.Cases = append(cf.Cases, a.c)
	}
	return cf, nil
}

// trimWatermarks drops leading watermarks that are superseded by a later one before any record
// (only the last matters), keeping the input order otherwise.
func trimWatermarks(in []CaseInput) []CaseInput {
	first := slices.IndexFunc(in, func(c CaseInput) bool { return !c.Watermark })
	if first <= 1 {
		return in
	}
	return slices.Concat(in[first-1:first], in[first:])
}
