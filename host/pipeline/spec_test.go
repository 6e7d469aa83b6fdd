package pipeline

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

const goodYAML = `
version: 1
name: clicks
key_groups: 64
checkpoints: {interval: 5s, retain: 5}
restart: {strategy: exponential-backoff, attempts: 4, delay: 100ms, max_delay: 2s}
sources:
  - name: clicks
    type: file
    path: clicks.jsonl
    parallelism: 2
    event_time: {field: ts, max_out_of_orderness: 2s, idle_timeout: 30s}
    on_malformed: skip
operators:
  - name: perUser
    module: counter.wasm
    inputs: [clicks]
    key: user
    parallelism: 4
    state: [count]
    limits: {memory_pages: 256, call_timeout: 50ms, max_in_flight: 512}
    late: side-output
  - name: enrich
    module: enrich.wasm
    inputs: [perUser]
    chain: true
    parallelism: 4
sinks:
  - {name: out, type: file, path: out.jsonl, inputs: [enrich]}
  - {name: late, type: stdout, inputs: [perUser.late, clicks.malformed]}
`

func TestParseSpecYAMLAndJSON(t *testing.T) {
	y, err := ParseSpec([]byte(goodYAML))
	if err != nil {
		t.Fatal(err)
	}
	js, err := MarshalSpec(y)
	if err != nil {
		t.Fatal(err)
	}
	j, err := ParseSpec(js)
	if err != nil {
		t.Fatalf("the JSON rendering does not parse: %v\n%s", err, js)
	}
	if !reflect.DeepEqual(y, j) {
		t.Fatalf("YAML and JSON differ:\n%+v\n%+v", y, j)
	}
	if y.KeyGroups != 64 || y.Checkpoints.Interval.D() != 5*time.Second || y.Checkpoints.Retain != 5 {
		t.Fatalf("settings: %+v", y)
	}
	if y.Sources[0].Options["path"] != "clicks.jsonl" || y.Sources[0].EventTime.MaxOutOfOrderness.D() != 2*time.Second {
		t.Fatalf("source: %+v", y.Sources[0])
	}
	if y.Operators[0].Key.Field != "user" || !y.Operators[1].Chain || y.Operators[0].Limits.CallTimeout.D() != 50*time.Millisecond {
		t.Fatalf("operators: %+v", y.Operators)
	}
	// Defaults.
	if y.Operators[1].Order != "per-key" || y.Sinks[0].Parallelism != 1 || y.Mode != ModeAuto || !*y.Checkpoints.FinalSavepoint ||
		y.Restart.Multiplier != 2 || y.Sources[0].EventTime.WatermarkEvery != DefaultWatermarkEvery {
		t.Fatalf("defaults not applied: %+v", y)
	}
}

func TestParseSpecErrors(t *testing.T) {
	base := `name: j
sources: [{name: s, type: file, path: x}]
operators: [{name: op, module: m.wasm, inputs: [s]}]
sinks: [{name: out, type: stdout, inputs: [op]}]
`
	cases := []struct {
		name, spec, path, reason string
	}{
		{"not yaml", "name: [", "", "not valid YAML"},
		{"not a mapping", "- 1\n- 2", "", "a spec is a mapping"},
		{"two documents", base + "---\nname: k\n", "", "more than one document"},
		{"typo", strings.Replace(base, "name: j", "name: j\ncheckpoint: {interval: 1s}", 1), "checkpoint", `did you mean "checkpoints"`},
		{"nested typo", strings.Replace(base, "inputs: [s]}", "inputs: [s], paralelism: 2}", 1), "operators[0].paralelism", `did you mean "parallelism"`},
		{"type", strings.Replace(base, "name: j", "name: j\nkey_groups: many", 1), "key_groups", "want a whole number"},
		{"fraction", strings.Replace(base, "name: j", "name: j\nparallelism: 1.5", 1), "parallelism", "want a whole number"},
		{"duration", strings.Replace(base, "name: j", "name: j\ncheckpoints: {interval: 10}", 1), "checkpoints.interval", "want a duration"},
		{"bad duration", strings.Replace(base, "name: j", "name: j\ncheckpoints: {interval: soon}", 1), "checkpoints.interval", "not a duration"},
		{"negative duration", strings.Replace(base, "name: j", "name: j\ncheckpoints: {interval: -1s}", 1), "checkpoints.interval", "negative"},
		{"no name", strings.Replace(base, "name: j\n", "", 1), "name", "required"},
		{"bad version", "version: 2\n" + base, "version", "spec version 1"},
		{"no sinks", strings.Split(base, "sinks:")[0], "sinks", "at least one sink"},
		{"duplicate", strings.Replace(base, "name: out", "name: op", 1), "sinks[0].name", "already the name of a operator"},
		{"unknown input", strings.Replace(base, "inputs: [s]", "inputs: [t]", 1), "operators[0].inputs[0]", `"t" names no source`},
		{"sink as input", strings.Replace(base, "inputs: [s]", "inputs: [out]", 1), "operators[0].inputs[0]", "is a sink"},
		{"side output", strings.Replace(base, "inputs: [op]", "inputs: [op.bogus]", 1), "sinks[0].inputs[0]", `no side output "bogus"`},
		{"unused operator", strings.Replace(base, "inputs: [op]", "inputs: [s]", 1), "operators[0]", "goes nowhere"},
		{"cycle", strings.Replace(base, "operators: [{name: op, module: m.wasm, inputs: [s]}]",
			"operators: [{name: op, module: m.wasm, inputs: [s, op2]}, {name: op2, module: m.wasm, inputs: [op]}]", 1), "operators", "cycle: op -> op2 -> op"},
		{"parallelism", strings.Replace(base, "inputs: [s]}", "inputs: [s], parallelism: 200, key: k}", 1), "operators[0].parallelism", "key_groups=128"},
		{"key needed", strings.Replace(base, "inputs: [s]}", "inputs: [s], parallelism: 2}", 1), "operators[0].key", "required for a keyed operator"},
		{"key twice", strings.Replace(base, "inputs: [s]}", "inputs: [s], key: {field: a, guest: true}}", 1), "operators[0].key", "exactly one of"},
		{"chain a source", strings.Replace(base, "inputs: [s]}", "inputs: [s], chain: true}", 1), "operators[0].chain", "not keyed yet"},
		{"chain parallelism", strings.Replace(base, "sinks: [{name: out, type: stdout, inputs: [op]}]",
			"  - {name: op2, module: m.wasm, inputs: [op], chain: true, parallelism: 2}\nsinks: [{name: out, type: stdout, inputs: [op2]}]", 1) + "",
			"", ""}, // replaced below
		{"restart", strings.Replace(base, "name: j", "name: j\nrestart: {strategy: sometimes}", 1), "restart.strategy", "not one of"},
		{"max delay", strings.Replace(base, "name: j", "name: j\nrestart: {strategy: fixed-delay, delay: 5s, max_delay: 1s}", 1), "restart.max_delay", "below"},
		{"order", strings.Replace(base, "inputs: [s]}", "inputs: [s], order: random}", 1), "operators[0].order", "not one of"},
		{"key with unkeyed order", strings.Replace(base, "inputs: [s]}", "inputs: [s], order: input, key: a}", 1), "operators[0].key", "unkeyed"},
		{"state name", strings.Replace(base, "inputs: [s]}", "inputs: [s], state: [\"a b\"]}", 1), "operators[0].state[0]", "not a state name"},
		{"endpoint", strings.Replace(base, "inputs: [s]}", "inputs: [s], endpoints: [{name: geo}]}", 1), "operators[0].endpoints[0].base_url", "required"},
		{"malformed policy", strings.Replace(base, "path: x}", "path: x, on_malformed: ignore}", 1), "sources[0].on_malformed", "not one of"},
		{"list", strings.Replace(base, "inputs: [op]", "inputs: op", 1), "sinks[0].inputs", "want a list"},
	}
	// A chained operator must keep its input's parallelism.
	cases[23].spec = `name: j
sources: [{name: s, type: file, path: x}]
operators:
  - {name: a, module: m.wasm, inputs: [s], key: k, parallelism: 2}
  - {name: b, module: m.wasm, inputs: [a], chain: true, parallelism: 3}
sinks: [{name: out, type: stdout, inputs: [b]}]
`
	cases[23].path, cases[23].reason = "operators[1].parallelism", "its input's parallelism (2)"
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseSpec([]byte(c.spec))
			var se *SpecError
			if !errors.As(err, &se) || !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("want a *SpecError, got %v", err)
			}
			for _, p := range se.Problems {
				if p.Path == c.path && strings.Contains(p.Reason, c.reason) {
					return
				}
			}
			t.Fatalf("want %s: ...%s..., got:\n%v", c.path, c.reason, err)
		})
	}
	if _, err := ParseSpec([]byte(base)); err != nil {
		t.Fatalf("the base spec: %v", err)
	}
}

func TestConnectorOptionErrors(t *testing.T) {
	c := &Connectors{}
	c.RegisterSource("file", func(spec *SourceSpec, o *ConnectorOptions, env *Env) (Source, error) {
		if o.String("path", "") == "" {
			o.Fail("path", "required")
		}
		o.Int("limit", 0)
		return nil, nil
	})
	c.RegisterSink("stdout", func(spec *SinkSpec, o *ConnectorOptions, env *Env) (Sink, error) { return nil, nil })
	s, err := ParseSpec([]byte(`name: j
sources: [{name: s, type: file, pth: x, limit: lots}, {name: t, type: kafka}]
operators: [{name: op, module: m.wasm, inputs: [s, t]}]
sinks: [{name: out, type: stdout, inputs: [op]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	err = c.ValidateConnectors(s, &Env{})
	var se *SpecError
	if !errors.As(err, &se) {
		t.Fatalf("want a SpecError, got %v", err)
	}
	want := map[string]string{"sources[0].path": "required", "sources[0].pth": "unknown field", "sources[0].limit": "whole number", "sources[1].type": `"kafka" is not a source type`}
	for _, p := range se.Problems {
		if r, ok := want[p.Path]; ok && strings.Contains(p.Reason, r) {
			delete(want, p.Path)
		}
	}
	if len(want) > 0 {
		t.Fatalf("missing %v in:\n%v", want, err)
	}
}

// FuzzParseSpec: ParseSpec never panics, and what it accepts survives a round trip through
// its JSON rendering unchanged. For input that encoding/json reads as an object, the YAML
// path must not accept anything encoding/json would see differently (JSON is YAML).
func FuzzParseSpec(f *testing.F) {
	f.Add([]byte(goodYAML))
	f.Add([]byte(`{"name":"j","sources":[{"name":"s","type":"file"}],"operators":[],"sinks":[{"name":"o","type":"stdout","inputs":["s"]}]}`))
	f.Add([]byte("name: j\nsources: [{name: s, type: file}]\nsinks: [{name: o, type: x, inputs: [s.malformed]}]\n"))
	f.Add([]byte("a: &a [*a]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseSpec(data)
		if err != nil {
			var se *SpecError
			if !errors.As(err, &se) || len(se.Problems) == 0 {
				t.Fatalf("error is not a SpecError with problems: %v", err)
			}
			return
		}
		js, err := MarshalSpec(s)
		if err != nil {
			t.Fatal(err)
		}
		s2, err := ParseSpec(js)
		if err != nil {
			t.Fatalf("rendering does not parse: %v\n%s", err, js)
		}
		if !reflect.DeepEqual(s, s2) {
			t.Fatalf("round trip changed the spec:\n%s", js)
		}
		var generic map[string]any
		if json.Unmarshal(data, &generic) == nil {
			if n, ok := generic["name"].(string); ok && n != s.Name {
				t.Fatalf("name %q read as %q", n, s.Name)
			}
		}
	})
}
