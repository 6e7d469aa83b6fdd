package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
)

// # Connectors
//
// A source is a set of splits (files, Kafka partitions, generator streams), each with a position
// that the checkpoint records. The runtime assigns splits to source subtasks (split i to
// subtask i mod parallelism; a scale-out worker passes only the splits it owns) and opens one
// SourceReader per subtask on them, from the positions of the restored checkpoint.
//
// A sink takes part in checkpoints as a two-phase-commit participant:
//
//   - each sink subtask's SinkWriter writes records, and on the barrier of checkpoint n
//     pre-commits them (durable, not yet visible) and returns a small handle;
//   - the coordinator turns every subtask's handle into the sink's part of checkpoint record n
//     (SinkCommitter.Prepare), commits the record, then calls Commit (idempotent);
//   - on restore, Recover gets the committed record's part: it re-commits it and discards
//     everything written after it.
//
// A sink whose own commit is the decision point (a transactional Kafka sink committing its
// transaction with a marker naming the record) also implements DecidingSink: the coordinator
// then writes the record as prepared, calls Decide, and commits the record; recovery rolls a
// prepared record forward when the sink says its decision committed. See docs/DESIGN.md,
// "Pipelines and checkpoints".

// SourceRecord is one record read by a source.
type SourceRecord struct {
	// Split is the index, in the reader's splits, of the split the record came from.
	Split int
	// Value is the record (a JSON object for the built-in formats). It is valid until the
	// next Read: the runtime copies it.
	Value []byte
	// Key is the key the source gave the record (a Kafka key), used by key: {source: true}.
	Key []byte
	// TS is the source's timestamp for the record, if HasTS (Kafka's); a field in the
	// spec's event_time overrides it.
	TS    int64
	HasTS bool
	// Pos names the record in its split (a byte offset, a Kafka offset) for messages and
	// idempotency keys.
	Pos int64
	// Malformed, when set, says the record could not be parsed: the runtime applies the
	// source's on_malformed policy (Value holds the raw bytes).
	Malformed error
}

// Split is one split of a source and its position.
type Split struct {
	// ID is stable across runs ("orders.jsonl", "topic/3").
	ID string `json:"id"`
	// Position is where reading resumes, as JSON of the connector's choosing (a byte offset
	// and line, a Kafka offset); nil is the beginning.
	Position json.RawMessage `json:"position,omitempty"`
}

// Source is a configured source.
type Source interface {
	// Splits lists the source's splits in a stable order.
	Splits(ctx context.Context) ([]string, error)
	// Bounded reports whether the source ends.
	Bounded() bool
	// Open returns a reader of splits, starting at their positions.
	Open(ctx context.Context, splits []Split) (SourceReader, error)
}

// SourceReader reads the splits one source subtask owns. It is used by one goroutine.
type SourceReader interface {
	// Read fills buf with up to len(buf) records. It may block, but briefly (tens of
	// milliseconds at most), so that barriers are injected promptly: returning 0 records and
	// nil means nothing is available now. io.EOF means every split is finished.
	Read(ctx context.Context, buf []SourceRecord) (int, error)
	// Positions returns every split's position after the last record Read returned.
	Positions() []Split
	Close() error
}

// SinkRecord is one record a sink writes.
type SinkRecord struct {
	Key   []byte
	Value []byte
	TS    int64
	// From names what produced it ("operator count"), Pos the source position of the record
	// that led to it: with the checkpoint, an idempotency key.
	Pos int64
}

// SinkContext tells a sink subtask who it is.
type SinkContext struct {
	Job, Tenant, Name    string
	Subtask, Parallelism int
	// Checkpoint is the checkpoint the job restored from (0 for a fresh start): records the
	// writer receives follow it.
	Checkpoint uint64
}

// Sink is a configured sink.
type Sink interface {
	// Open opens one sink subtask. Called after the committer's Recover.
	Open(ctx context.Context, sc SinkContext) (SinkWriter, error)
	// Committer returns the sink's checkpoint participant; nil for a sink that is not
	// transactional (at least once: stdout, discard).
	Committer() SinkCommitter
}

// SinkWriter writes the records of one sink subtask. It is used by one goroutine.
type SinkWriter interface {
	// Write writes recs. It must not keep recs, or the bytes their Key and Value point to, once
	// it returns: the runtime reuses them. A sink that sends later copies what it sends (the
	// Kafka and webhook sinks do).
	Write(ctx context.Context, recs []SinkRecord) error
	// PreCommit makes everything written since the last checkpoint durable but not visible,
	// and returns a handle naming it (kept in the checkpoint record: keep it small).
	PreCommit(ctx context.Context, checkpoint uint64) ([]byte, error)
	// Close ends the writer. Records not pre-committed are abandoned (Recover discards them).
	Close(ctx context.Context) error
}

// SinkCommitter is a sink's part in the checkpoint protocol, called by the coordinator.
type SinkCommitter interface {
	// Prepare turns the subtasks' pre-commit handles of checkpoint n (indexed by subtask) into
	// the sink's part of the checkpoint record. It must not make anything visible.
	Prepare(ctx context.Context, checkpoint uint64, handles [][]byte) ([]byte, error)
	// Commit makes checkpoint n's output visible once its record is durable. It is idempotent:
	// recovery calls it again for the restored checkpoint.
	Commit(ctx context.Context, checkpoint uint64, prepared []byte) error
	// Recover runs before the writers open: it re-commits the restored checkpoint's part
	// (nil, 0 for a fresh start) and discards everything not committed by it.
	Recover(ctx context.Context, checkpoint uint64, prepared []byte) error
}

// DecidingSink is a SinkCommitter whose commit decides the checkpoint (issue 13's order:
// state delta uploaded, then the sink's transaction committed with a marker naming the
// record, then the record committed).
type DecidingSink interface {
	SinkCommitter
	// Decide commits checkpoint n's transaction together with a marker naming the record.
	// Once it returns nil the checkpoint is decided: recovery rolls it forward.
	Decide(ctx context.Context, checkpoint uint64, record string, prepared []byte) error
	// Decided returns the newest checkpoint whose decision committed (0 if none).
	Decided(ctx context.Context) (uint64, error)
}

// ConnectorOptions are a connector's own fields from the spec. Take them with the typed getters, which
// remember what was read so that Finish can report unknown fields.
type ConnectorOptions struct {
	path string
	m    map[string]any
	used map[string]bool
	p    problems

	// job and tenant name the job whose spec holds the options (set by the runtime).
	job, tenant string
}

// NewOptions wraps a source's or sink's options; path prefixes error paths ("sources[0]").
func NewOptions(path string, m map[string]any) *ConnectorOptions {
	return &ConnectorOptions{path: path, m: m, used: map[string]bool{}}
}

// Job returns the tenant and name of the job the connector belongs to (empty outside a job's
// spec): a connector that names things outside the pipeline (Kafka transactional IDs) derives
// them from it.
func (o *ConnectorOptions) Job() (tenant, name string) { return o.tenant, o.job }

// Path returns the field path of an option.
func (o *ConnectorOptions) Path(k string) string { return join(o.path, k) }

// Fail records a problem with option k.
func (o *ConnectorOptions) Fail(k, format string, args ...any) { o.p.add(o.Path(k), format, args...) }

func (o *ConnectorOptions) get(k string) (any, bool) {
	o.used[k] = true
	v, ok := o.m[k]
	return v, ok && v != nil
}

// String returns option k, or def.
func (o *ConnectorOptions) String(k, def string) string {
	v, ok := o.get(k)
	if !ok {
		return def
	}
	s, isStr := v.(string)
	if !isStr {
		o.Fail(k, "want a string, not %s", describe(v))
		return def
	}
	return s
}

// Int returns option k, or def.
func (o *ConnectorOptions) Int(k string, def int64) int64 {
	v, ok := o.get(k)
	if !ok {
		return def
	}
	f, isNum := number(v)
	if !isNum || f != float64(int64(f)) {
		o.Fail(k, "want a whole number, not %s", describe(v))
		return def
	}
	return int64(f)
}

// Float returns option k, or def.
func (o *ConnectorOptions) Float(k string, def float64) float64 {
	v, ok := o.get(k)
	if !ok {
		return def
	}
	f, isNum := number(v)
	if !isNum {
		o.Fail(k, "want a number, not %s", describe(v))
		return def
	}
	return f
}

// Bool returns option k, or def.
func (o *ConnectorOptions) Bool(k string, def bool) bool {
	v, ok := o.get(k)
	if !ok {
		return def
	}
	b, isBool := v.(bool)
	if !isBool {
		o.Fail(k, "want true or false, not %s", describe(v))
		return def
	}
	return b
}

// Raw returns option k as the spec decoded it (a string, number, bool, list or map), for a
// connector with structured options to decode itself.
func (o *ConnectorOptions) Raw(k string) (any, bool) { return o.get(k) }

// Finish reports unknown options and every problem recorded.
func (o *ConnectorOptions) Finish() error {
	var keys []string
	for k := range o.m {
		if !o.used[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		o.Fail(k, "unknown field for this connector")
	}
	return o.p.err()
}

// SourceFactory builds a source from its spec. Env gives file paths their base directory.
type SourceFactory func(spec *SourceSpec, opts *ConnectorOptions, env *Env) (Source, error)

// SinkFactory builds a sink from its spec.
type SinkFactory func(spec *SinkSpec, opts *ConnectorOptions, env *Env) (Sink, error)

// Connectors maps connector types to factories. The zero value is empty; Register adds to it.
type Connectors struct {
	mu      sync.Mutex
	sources map[string]SourceFactory
	sinks   map[string]SinkFactory
}

// RegisterSource adds a source type.
func (c *Connectors) RegisterSource(typ string, f SourceFactory) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sources == nil {
		c.sources = map[string]SourceFactory{}
	}
	c.sources[typ] = f
}

// RegisterSink adds a sink type.
func (c *Connectors) RegisterSink(typ string, f SinkFactory) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sinks == nil {
		c.sinks = map[string]SinkFactory{}
	}
	c.sinks[typ] = f
}

func (c *Connectors) types(m map[string]SourceFactory, n map[string]SinkFactory) string {
	var ts []string
	for t := range m {
		ts = append(ts, t)
	}
	for t := range n {
		ts = append(ts, t)
	}
	sort.Strings(ts)
	return fmt.Sprint(ts)
}

// ErrUnknownConnector is returned for a type nothing registered.
var ErrUnknownConnector = errors.New("unknown connector type")

// build constructs every source and sink of spec, collecting every problem.
func (c *Connectors) build(spec *Spec, env *Env) (map[string]Source, map[string]Sink, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var all []*FieldError
	collect := func(err error) {
		var se *SpecError
		if errors.As(err, &se) {
			all = append(all, se.Problems...)
		} else if err != nil {
			all = append(all, &FieldError{Reason: err.Error()})
		}
	}
	srcs := map[string]Source{}
	for i := range spec.Sources {
		s := &spec.Sources[i]
		path := fmt.Sprintf("sources[%d]", i)
		f := c.sources[s.Type]
		if f == nil {
			all = append(all, &FieldError{Path: path + ".type", Reason: fmt.Sprintf("%q is not a source type here (have %s)", s.Type, c.types(c.sources, nil))})
			continue
		}
		o := NewOptions(path, s.Options)
		o.job, o.tenant = spec.Name, spec.Tenant
		src, err := f(s, o, env)
		collect(o.Finish())
		if err != nil {
			collect(fmt.Errorf("%s: %w", path, err))
			continue
		}
		srcs[s.Name] = src
	}
	sinks := map[string]Sink{}
	for i := range spec.Sinks {
		s := &spec.Sinks[i]
		path := fmt.Sprintf("sinks[%d]", i)
		f := c.sinks[s.Type]
		if f == nil {
			all = append(all, &FieldError{Path: path + ".type", Reason: fmt.Sprintf("%q is not a sink type here (have %s)", s.Type, c.types(nil, c.sinks))})
			continue
		}
		o := NewOptions(path, s.Options)
		o.job, o.tenant = spec.Name, spec.Tenant
		sk, err := f(s, o, env)
		collect(o.Finish())
		if err != nil {
			collect(fmt.Errorf("%s: %w", path, err))
			continue
		}
		sinks[s.Name] = sk
	}
	if len(all) > 0 {
		return nil, nil, &SpecError{Problems: all}
	}
	return srcs, sinks, nil
}

// ValidateConnectors checks every source's and sink's connector options, building (but not
// opening) them.
func (c *Connectors) ValidateConnectors(spec *Spec, env *Env) error {
	_, _, err := c.build(spec, env)
	return err
}
