package pipeline

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// SpecVersion is the version of the pipeline spec format this host reads.
const SpecVersion = 1

// MaxSpecBytes bounds a spec document.
const MaxSpecBytes = 1 << 20

// Spec is a pipeline: sources, keyed operators and sinks wired into a DAG, with its event time,
// checkpoint and restart settings. It is read from YAML or JSON by ParseSpec and documented
// field by field in docs/pipeline-spec.md. The same spec runs under `clink-wasm run
// --pipeline`, the server and workers.
type Spec struct {
	Version int `json:"version"`
	// Name is the job's identity: its checkpoints and state live under it.
	Name string `json:"name"`
	// Tenant namespaces state and checkpoints (set by the server; optional locally).
	Tenant string `json:"tenant,omitempty"`
	// Mode is the execution mode: bounded, streaming or auto (default: bounded when every
	// source is bounded).
	Mode ExecutionMode `json:"mode,omitempty"`
	// KeyGroups is the fixed number of key groups (default 128): the most any operator can be
	// scaled to, and fixed for the life of the job's state.
	KeyGroups int `json:"key_groups,omitempty"`
	// Parallelism is the default parallelism of operators and sinks (default 1).
	Parallelism int `json:"parallelism,omitempty"`

	State       StateSpec      `json:"state,omitempty"`
	Checkpoints CheckpointSpec `json:"checkpoints,omitempty"`
	Restart     RestartSpec    `json:"restart,omitempty"`

	Sources   []SourceSpec   `json:"sources"`
	Operators []OperatorSpec `json:"operators"`
	Sinks     []SinkSpec     `json:"sinks"`
}

// ExecutionMode says whether a job ends.
type ExecutionMode string

const (
	ModeAuto      ExecutionMode = "auto"
	ModeBounded   ExecutionMode = "bounded"
	ModeStreaming ExecutionMode = "streaming"
)

// StateSpec is where keyed state and checkpoint records live.
type StateSpec struct {
	// URL of the durable pool: file:///dir, s3://bucket/prefix, mem://name. Default: the
	// environment's (the CLI uses file:// under .clink/state).
	URL string `json:"url,omitempty"`
}

// CheckpointSpec configures checkpoints.
type CheckpointSpec struct {
	// Interval between periodic checkpoints (default 10s; "0s" takes only the final one).
	Interval *Duration `json:"interval,omitempty"`
	// Retain is how many committed checkpoint records are kept (default 3; savepoints are
	// always kept).
	Retain int `json:"retain,omitempty"`
	// Timeout fails a checkpoint that takes longer (default 5m).
	Timeout Duration `json:"timeout,omitempty"`
	// FinalSavepoint makes the checkpoint at the end of a bounded job a savepoint (default true).
	FinalSavepoint *bool `json:"final_savepoint,omitempty"`
}

// RestartSpec is the restart strategy: after a failure the job restores in process from its
// last committed checkpoint, up to Attempts times.
type RestartSpec struct {
	// Strategy: none (default), fixed-delay or exponential-backoff.
	Strategy string `json:"strategy,omitempty"`
	// Attempts is the most restarts before the job fails (default 3 for the strategies).
	Attempts int `json:"attempts,omitempty"`
	// Delay before the first restart (default 1s).
	Delay Duration `json:"delay,omitempty"`
	// MaxDelay caps exponential backoff (default 1m).
	MaxDelay Duration `json:"max_delay,omitempty"`
	// Multiplier of exponential backoff (default 2).
	Multiplier float64 `json:"multiplier,omitempty"`
}

// SourceSpec is one source. Fields other than the common ones below belong to the connector
// of its Type (docs/pipeline-spec.md lists them) and are kept in Options.
type SourceSpec struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// Parallelism is the number of source subtasks; splits are spread over them (default: 1).
	Parallelism int `json:"parallelism,omitempty"`
	// EventTime takes timestamps from the records and generates watermarks.
	EventTime *EventTimeSpec `json:"event_time,omitempty"`
	// OnMalformed: fail (default) stops the job naming the record; skip drops it and sends it
	// to the side output NAME.malformed when something reads that.
	OnMalformed MalformedPolicy `json:"on_malformed,omitempty"`
	// Options are the connector's own fields.
	Options map[string]any `json:"options,omitempty"`
}

// EventTimeSpec configures timestamps and watermarks of a source.
type EventTimeSpec struct {
	// Field is the top-level field holding the event time (epoch ms or RFC 3339). Empty: the
	// connector's own timestamp if it has one (Kafka), else ingestion time.
	Field string `json:"field,omitempty"`
	// MaxOutOfOrderness: each split's watermark is its largest timestamp minus this.
	MaxOutOfOrderness Duration `json:"max_out_of_orderness,omitempty"`
	// IdleTimeout: a split with no record for this long stops holding the watermark back
	// (default 0: never idle).
	IdleTimeout Duration `json:"idle_timeout,omitempty"`
	// WatermarkEvery emits a watermark after this many records of a subtask (default 1000).
	WatermarkEvery int `json:"watermark_every,omitempty"`
}

// OperatorSpec is one keyed Wasm operator.
type OperatorSpec struct {
	Name string `json:"name"`
	// Module is the operator's .wasm: a path (relative to the spec file), or for the server a
	// registry reference "sha256:HEX" or "NAME@VERSION".
	Module string `json:"module"`
	// Inputs name sources, operators, or side outputs ("NAME.late", "NAME.malformed").
	Inputs []string `json:"inputs"`
	// Key partitions the operator's input: records are re-keyed and hashed onto its subtasks
	// by key group. A string is shorthand for {field: NAME}.
	Key *KeySpec `json:"key,omitempty"`
	// Chain forwards the single input's records subtask to subtask, keeping their key, with
	// no re-keying: the input must have the same parallelism and be keyed the same way.
	Chain bool `json:"chain,omitempty"`
	// Parallelism is the number of subtasks (default: the spec's).
	Parallelism int `json:"parallelism,omitempty"`
	// State lists the state names the module must declare (checked against its manifest).
	State []string `json:"state,omitempty"`
	// Endpoints are the named HTTP endpoints of lookups.
	Endpoints []lookup.EndpointConfig `json:"endpoints,omitempty"`
	Limits    LimitsSpec              `json:"limits,omitempty"`
	// Order: per-key (default), input or none (unkeyed enrichment).
	Order string `json:"order,omitempty"`
	// Late records (event time at or before the operator's watermark): drop (default) or
	// side-output (to NAME.late).
	Late string `json:"late,omitempty"`
	// OnError: fail (default) fails the job when the guest faults on a record; dead-letter
	// sends a record whose call faulted without changing anything to the side output
	// NAME.errors, with a reason naming the operator and the record, and goes on.
	OnError string `json:"on_error,omitempty"`
	// Retries runs a record whose call faulted without changing anything again, up to this
	// many times (0-10, default 0), before on_error applies.
	Retries int `json:"retries,omitempty"`
}

// KeySpec says how records are keyed for an operator.
type KeySpec struct {
	// Field keys by a top-level field of the record.
	Field string `json:"field,omitempty"`
	// Guest keys by the module's clink_key export.
	Guest bool `json:"guest,omitempty"`
	// Source keeps the key the source gave the record (a Kafka key).
	Source bool `json:"source,omitempty"`
}

// LimitsSpec bounds an operator's guest.
type LimitsSpec struct {
	MemoryPages    uint32   `json:"memory_pages,omitempty"`
	CallTimeout    Duration `json:"call_timeout,omitempty"`
	MaxInFlight    int      `json:"max_in_flight,omitempty"`
	MaxRecordBytes int      `json:"max_record_bytes,omitempty"`
}

// SinkSpec is one sink. Connector fields are kept in Options, as for sources.
type SinkSpec struct {
	Name        string         `json:"name"`
	Type        string         `json:"type"`
	Inputs      []string       `json:"inputs"`
	Parallelism int            `json:"parallelism,omitempty"`
	Options     map[string]any `json:"options,omitempty"`
}

// Duration is a time.Duration written as a string ("250ms", "10s").
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string like \"250ms\" or \"10s\"")
	}
	v, err := parseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

func parseDuration(s string) (time.Duration, error) {
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration like \"250ms\" or \"10s\"", s)
	}
	if v < 0 {
		return 0, fmt.Errorf("%q is negative", s)
	}
	return v, nil
}

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// FieldError is a spec problem at a field.
type FieldError struct {
	Path   string // e.g. operators[1].key.field
	Reason string
}

func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Reason
	}
	return e.Path + ": " + e.Reason
}

// SpecError lists every problem found in a spec.
type SpecError struct{ Problems []*FieldError }

func (e *SpecError) Error() string {
	var b strings.Builder
	b.WriteString("invalid pipeline spec")
	if len(e.Problems) == 1 {
		b.WriteString(": ")
		b.WriteString(e.Problems[0].Error())
		return b.String()
	}
	fmt.Fprintf(&b, " (%d problems):", len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(p.Error())
	}
	return b.String()
}

// ErrInvalidSpec matches every *SpecError.
var ErrInvalidSpec = errors.New("invalid pipeline spec")

func (e *SpecError) Is(target error) bool { return target == ErrInvalidSpec }

type problems struct{ list []*FieldError }

func (p *problems) add(path, format string, args ...any) {
	if len(p.list) < 100 {
		p.list = append(p.list, &FieldError{Path: path, Reason: fmt.Sprintf(format, args...)})
	}
}

func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	return &SpecError{Problems: p.list}
}

var (
	nameRE      = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	stateNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)
)

// Defaults.
const (
	DefaultCheckpointInterval = 10 * time.Second
	DefaultCheckpointRetain   = 3
	DefaultCheckpointTimeout  = 5 * time.Minute
	DefaultWatermarkEvery     = 1000
)

// sideOutputs are the side outputs each kind of node has.
var (
	sourceSideOutputs   = []string{"malformed"}
	operatorSideOutputs = []string{"late", "errors"}
)

// ApplyDefaults fills in every default. ParseSpec calls it; a spec built in Go should call it
// before Validate.
func (s *Spec) ApplyDefaults() {
	if s.Version == 0 {
		s.Version = SpecVersion
	}
	if s.KeyGroups == 0 {
		s.KeyGroups = state.DefaultKeyGroups
	}
	if s.Parallelism == 0 {
		s.Parallelism = 1
	}
	if s.Mode == "" {
		s.Mode = ModeAuto
	}
	if s.Checkpoints.Interval == nil {
		d := Duration(DefaultCheckpointInterval)
		s.Checkpoints.Interval = &d
	}
	if s.Checkpoints.Retain == 0 {
		s.Checkpoints.Retain = DefaultCheckpointRetain
	}
	if s.Checkpoints.Timeout == 0 {
		s.Checkpoints.Timeout = Duration(DefaultCheckpointTimeout)
	}
	if s.Checkpoints.FinalSavepoint == nil {
		t := true
		s.Checkpoints.FinalSavepoint = &t
	}
	r := &s.Restart
	if r.Strategy == "" {
		r.Strategy = "none"
	}
	if r.Strategy != "none" {
		if r.Attempts == 0 {
			r.Attempts = 3
		}
		if r.Delay == 0 {
			r.Delay = Duration(time.Second)
		}
		if r.MaxDelay == 0 {
			r.MaxDelay = Duration(time.Minute)
		}
		if r.Multiplier == 0 {
			r.Multiplier = 2
		}
	}
	for i := range s.Sources {
		src := &s.Sources[i]
		if src.Parallelism == 0 {
			src.Parallelism = 1
		}
		if src.OnMalformed == "" {
			src.OnMalformed = MalformedFail
		}
		if et := src.EventTime; et != nil && et.WatermarkEvery == 0 {
			et.WatermarkEvery = DefaultWatermarkEvery
		}
	}
	for i := range s.Operators {
		op := &s.Operators[i]
		if op.Parallelism == 0 {
			op.Parallelism = s.Parallelism
		}
		if op.Order == "" {
			op.Order = "per-key"
		}
		if op.Late == "" {
			op.Late = "drop"
		}
		if op.OnError == "" {
			op.OnError = "fail"
		}
	}
	for i := range s.Sinks {
		if s.Sinks[i].Parallelism == 0 {
			s.Sinks[i].Parallelism = 1
		}
	}
}

// Validate checks the spec's structure: names, references, the DAG, parallelism and settings.
// Connector options are checked by the connectors when the job is built (ValidateConnectors).
// The error is a *SpecError listing every problem with its field path.
func (s *Spec) Validate() error {
	var p problems
	if s.Version != SpecVersion {
		p.add("version", "this host reads spec version %d, not %d", SpecVersion, s.Version)
	}
	if !nameRE.MatchString(s.Name) {
		p.add("name", "required: 1-64 characters of [A-Za-z0-9_-]")
	}
	if s.Tenant != "" && !nameRE.MatchString(s.Tenant) {
		p.add("tenant", "use 1-64 characters of [A-Za-z0-9_-]")
	}
	switch s.Mode {
	case ModeAuto, ModeBounded, ModeStreaming:
	default:
		p.add("mode", "%q is not one of auto, bounded, streaming", s.Mode)
	}
	if s.KeyGroups < 1 || s.KeyGroups > state.MaxKeyGroups {
		p.add("key_groups", "must be in [1, %d]", state.MaxKeyGroups)
	}
	kg := max(s.KeyGroups, 1)
	if s.Parallelism < 1 || s.Parallelism > kg {
		p.add("parallelism", "must be in [1, key_groups=%d]", kg)
	}
	if s.Checkpoints.Retain < 1 || s.Checkpoints.Retain > 1000 {
		p.add("checkpoints.retain", "must be in [1, 1000]")
	}
	s.validateRestart(&p)

	// Names are one namespace: an input names a node, or a node's side output.
	kinds := map[string]string{}
	parallel := map[string]int{}
	declare := func(path, name, kind string, par int) {
		if !nameRE.MatchString(name) {
			p.add(path+".name", "required: 1-64 characters of [A-Za-z0-9_-]")
			return
		}
		if k, dup := kinds[name]; dup {
			p.add(path+".name", "%q is already the name of a %s (names are shared by sources, operators and sinks)", name, k)
			return
		}
		kinds[name], parallel[name] = kind, par
	}
	if len(s.Sources) == 0 {
		p.add("sources", "a pipeline needs at least one source")
	}
	if len(s.Sinks) == 0 {
		p.add("sinks", "a pipeline needs at least one sink")
	}
	for i := range s.Sources {
		src := &s.Sources[i]
		path := fmt.Sprintf("sources[%d]", i)
		declare(path, src.Name, "source", src.Parallelism)
		if src.Type == "" {
			p.add(path+".type", "required: the connector (file, generator, http, ...)")
		}
		if src.Parallelism < 1 || src.Parallelism > 1024 {
			p.add(path+".parallelism", "must be in [1, 1024]")
		}
		switch src.OnMalformed {
		case MalformedFail, MalformedSkip:
		default:
			p.add(path+".on_malformed", "%q is not one of fail, skip", src.OnMalformed)
		}
		if et := src.EventTime; et != nil {
			if et.WatermarkEvery < 1 {
				p.add(path+".event_time.watermark_every", "must be at least 1")
			}
		}
	}
	for i := range s.Operators {
		op := &s.Operators[i]
		path := fmt.Sprintf("operators[%d]", i)
		declare(path, op.Name, "operator", op.Parallelism)
		if op.Module == "" {
			p.add(path+".module", "required: a .wasm path, sha256:HEX or NAME@VERSION")
		}
		if op.Parallelism < 1 || op.Parallelism > kg {
			p.add(path+".parallelism", "must be in [1, key_groups=%d]", kg)
		}
		switch op.Order {
		case "per-key", "input", "none":
		default:
			p.add(path+".order", "%q is not one of per-key, input, none", op.Order)
		}
		switch op.Late {
		case "drop", "side-output":
		default:
			p.add(path+".late", "%q is not one of drop, side-output", op.Late)
		}
		switch op.OnError {
		case "fail", "dead-letter":
		default:
			p.add(path+".on_error", "%q is not one of fail, dead-letter", op.OnError)
		}
		if op.Retries < 0 || op.Retries > 10 {
			p.add(path+".retries", "must be in [0, 10]")
		}
		if k := op.Key; k != nil {
			n := 0
			for _, b := range []bool{k.Field != "", k.Guest, k.Source} {
				if b {
					n++
				}
			}
			if n != 1 {
				p.add(path+".key", "give exactly one of field, guest, source")
			}
			if op.Chain {
				p.add(path+".chain", "a chained operator keeps its input's key; remove key or chain")
			}
			if op.Order != "per-key" {
				p.add(path+".key", "order %s is unkeyed: remove key", op.Order)
			}
		}
		if op.Chain && len(op.Inputs) != 1 {
			p.add(path+".chain", "a chained operator has exactly one input")
		}
		for j, st := range op.State {
			if !stateNameRE.MatchString(st) {
				p.add(fmt.Sprintf("%s.state[%d]", path, j), "%q is not a state name", st)
			}
		}
		seen := map[string]bool{}
		for j, ep := range op.Endpoints {
			if ep.Name == "" || seen[ep.Name] {
				p.add(fmt.Sprintf("%s.endpoints[%d].name", path, j), "required and unique")
			}
			seen[ep.Name] = true
			if ep.BaseURL == "" {
				p.add(fmt.Sprintf("%s.endpoints[%d].base_url", path, j), "required")
			}
		}
		if l := op.Limits; l.MemoryPages > 65536 {
			p.add(path+".limits.memory_pages", "must be at most 65536 (4 GiB)")
		}
		if op.Limits.MaxInFlight < 0 {
			p.add(path+".limits.max_in_flight", "must not be negative")
		}
	}
	for i := range s.Sinks {
		sk := &s.Sinks[i]
		path := fmt.Sprintf("sinks[%d]", i)
		declare(path, sk.Name, "sink", sk.Parallelism)
		if sk.Type == "" {
			p.add(path+".type", "required: the connector (file, stdout, http, discard, ...)")
		}
		if sk.Parallelism < 1 || sk.Parallelism > kg {
			p.add(path+".parallelism", "must be in [1, key_groups=%d]", kg)
		}
	}
	// References and the DAG.
	used := map[string]bool{}
	checkInputs := func(path string, inputs []string) {
		if len(inputs) == 0 {
			p.add(path+".inputs", "required: at least one source, operator or side output")
		}
		seen := map[string]bool{}
		for j, in := range inputs {
			ip := fmt.Sprintf("%s.inputs[%d]", path, j)
			if seen[in] {
				p.add(ip, "%q is listed twice", in)
			}
			seen[in] = true
			node, side, _ := strings.Cut(in, ".")
			kind, ok := kinds[node]
			switch {
			case !ok:
				p.add(ip, "%q names no source or operator", in)
			case kind == "sink":
				p.add(ip, "%q is a sink; sinks have no output", in)
			case side != "":
				allowed := operatorSideOutputs
				if kind == "source" {
					allowed = sourceSideOutputs
				}
				if !slices.Contains(allowed, side) {
					p.add(ip, "a %s has no side output %q (it has %s)", kind, side, strings.Join(allowed, ", "))
				}
			}
			used[node] = true
		}
	}
	for i := range s.Operators {
		op := &s.Operators[i]
		path := fmt.Sprintf("operators[%d]", i)
		checkInputs(path, op.Inputs)
		if op.Chain && len(op.Inputs) == 1 {
			in := op.Inputs[0]
			if strings.Contains(in, ".") {
				p.add(path+".chain", "a side output cannot be chained; key it instead")
			} else if kinds[in] == "operator" && parallel[in] != op.Parallelism {
				p.add(path+".parallelism", "a chained operator has its input's parallelism (%d)", parallel[in])
			} else if kinds[in] == "source" {
				p.add(path+".chain", "the input %q is a source, whose records are not keyed yet: give a key", in)
			}
		}
		if !op.Chain && op.Key == nil && op.Order == "per-key" && op.Parallelism > 1 {
			p.add(path+".key", "required for a keyed operator with parallelism > 1 (or chain: true)")
		}
	}
	for i := range s.Sinks {
		checkInputs(fmt.Sprintf("sinks[%d]", i), s.Sinks[i].Inputs)
	}
	for i := range s.Sources {
		if n := s.Sources[i].Name; kinds[n] == "source" && !used[n] {
			p.add(fmt.Sprintf("sources[%d]", i), "source %q is read by nothing", n)
		}
	}
	for i := range s.Operators {
		if n := s.Operators[i].Name; kinds[n] == "operator" && !used[n] {
			p.add(fmt.Sprintf("operators[%d]", i), "the output of %q goes nowhere: add it to a sink's inputs", n)
		}
	}
	for i := range s.Operators {
		op := &s.Operators[i]
		if op.OnError != "dead-letter" {
			continue
		}
		read := false
		for _, in := range s.allInputs() {
			read = read || in == op.Name+".errors"
		}
		if !read {
			p.add(fmt.Sprintf("operators[%d].on_error", i), "dead letters go to %s.errors, which nothing reads: add it to a sink's inputs", op.Name)
		}
	}
	if len(p.list) == 0 {
		if cyc := s.cycle(); cyc != nil {
			p.add("operators", "the graph has a cycle: %s", strings.Join(cyc, " -> "))
		}
	}
	return p.err()
}

func (s *Spec) validateRestart(p *problems) {
	r := s.Restart
	switch r.Strategy {
	case "none":
		return
	case "fixed-delay", "exponential-backoff":
	default:
		p.add("restart.strategy", "%q is not one of none, fixed-delay, exponential-backoff", r.Strategy)
		return
	}
	if r.Attempts < 1 || r.Attempts > 1000 {
		p.add("restart.attempts", "must be in [1, 1000]")
	}
	if r.Multiplier < 1 || math.IsInf(r.Multiplier, 0) || math.IsNaN(r.Multiplier) {
		p.add("restart.multiplier", "must be at least 1")
	}
	if r.MaxDelay < r.Delay {
		p.add("restart.max_delay", "must not be below restart.delay")
	}
}

// cycle returns a cycle among operators, or nil.
func (s *Spec) cycle() []string {
	deps := map[string][]string{}
	for _, op := range s.Operators {
		for _, in := range op.Inputs {
			node, _, _ := strings.Cut(in, ".")
			deps[op.Name] = append(deps[op.Name], node)
		}
	}
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var stack []string
	var found []string
	var visit func(n string) bool
	visit = func(n string) bool {
		color[n] = grey
		stack = append(stack, n)
		for _, d := range deps[n] {
			switch color[d] {
			case grey:
				i := slices.Index(stack, d)
				found = append(slices.Clone(stack[i:]), d)
				return true
			case white:
				if visit(d) {
					return true
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[n] = black
		return false
	}
	for _, op := range s.Operators {
		if color[op.Name] == white && visit(op.Name) {
			return found
		}
	}
	return nil
}

// allInputs lists every input of every operator and sink.
func (s *Spec) allInputs() []string {
	var all []string
	for _, op := range s.Operators {
		all = append(all, op.Inputs...)
	}
	for _, sk := range s.Sinks {
		all = append(all, sk.Inputs...)
	}
	return all
}

// Operator returns the operator named name, or nil.
func (s *Spec) Operator(name string) *OperatorSpec {
	for i := range s.Operators {
		if s.Operators[i].Name == name {
			return &s.Operators[i]
		}
	}
	return nil
}
