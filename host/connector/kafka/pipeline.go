package kafka

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// # The pipeline adapters
//
// Register puts `type: kafka` sources and sinks into a pipeline.Connectors. The source side
// maps one pipeline split to one partition ("topic/3") whose position is the offset of the
// next record; every source subtask's reader is one Source. The runtime keeps the positions
// in the checkpoint record and opens readers from them on restore, and it derives
// per-partition watermarks (with idle_timeout) from each record's split and timestamp.
//
// The exactly-once sink is a pipeline.DecidingSink. Per checkpoint n:
//
//	barrier n    each subtask's writer: Sink.PreCommit(n): marker naming record n and
//	             flush, into transaction n; the writer goes on with n+1 on its other slot
//	Prepare      the subtasks' Prepared (transactional ID, producer ID and epoch) become the
//	             sink's part of the record; the runtime writes the record as prepared
//	Decide       every subtask's transaction n commits (in parallel): the decision point
//	commit       the runtime commits record n; Commit is then a no-op
//
// and on restore: Decided (the newest checkpoint any subtask's committed marker names, after
// waiting out commits in flight) lets the runtime roll a prepared record forward; then
// Recover(c) finishes the transactions of c that a crash left open (some subtask committed,
// so all must), fences every transactional ID of the sink (aborting everything after c) and
// checks that what is committed is exactly checkpoint c. docs/DESIGN.md, "Kafka exactly
// once", has the table of crash points.

// Register adds the kafka source and sink to c.
func Register(c *pipeline.Connectors) {
	c.RegisterSource("kafka", NewPipelineSource)
	c.RegisterSink("kafka", NewPipelineSink)
}

// Hosted is what a multi-tenant server decides for its tenants' Kafka connectors
// (RegisterHosted). The spec of a hosted pipeline must not reach the server's own environment
// or files, nor another tenant's transactions:
//   - AllowBroker checks each broker (host:port) for the tenant, as the server checks a
//     webhook's URL; nil refuses every broker;
//   - Secret resolves the names in sasl.username_env and sasl.password_env for the tenant (a
//     secret store of the server's); nil refuses SASL. The server's environment variables
//     are never read;
//   - TLS files (ca_file, cert_file, key_file) are refused: the system roots verify;
//   - transactional_id_prefix and marker_topic are refused: they come from the tenant and
//     the job.
type Hosted struct {
	AllowBroker func(tenant, hostport string) error
	Secret      func(tenant, name string) (string, bool)
}

// RegisterHosted adds the kafka source and sink with the restrictions of h.
func RegisterHosted(c *pipeline.Connectors, h Hosted) {
	c.RegisterSource("kafka", func(spec *pipeline.SourceSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Source, error) {
		return newPipelineSource(spec, o, env, &h)
	})
	c.RegisterSink("kafka", func(spec *pipeline.SinkSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Sink, error) {
		return newPipelineSink(spec, o, env, &h)
	})
}

// restrict applies h to a connector's cluster configuration, recording every problem; it
// reports whether the configuration may be used.
func (h *Hosted) restrict(o *pipeline.ConnectorOptions, c *Config) bool {
	ok := true
	tenant, _ := o.Job()
	for i, b := range c.Brokers {
		var err error
		if h.AllowBroker == nil {
			err = errors.New("this server allows no Kafka brokers")
		} else {
			err = h.AllowBroker(tenant, b)
		}
		if err != nil {
			o.Fail(fmt.Sprintf("brokers[%d]", i), "%v", err)
			ok = false
		}
	}
	if t := c.TLS; t != nil && (t.CAFile != "" || t.CertFile != "" || t.KeyFile != "") {
		o.Fail("tls", "files on the server are not available to hosted pipelines (the system roots verify the brokers)")
		ok = false
	}
	if c.SASL != nil {
		if h.Secret == nil {
			o.Fail("sasl", "this server has no secret store for Kafka credentials")
			ok = false
		} else {
			c.env = func(name string) (string, bool) { return h.Secret(tenant, name) }
		}
	}
	return ok
}

// decodeOptions decodes the options named in fields (each into its pointer) from their JSON
// form, naming the field of any problem. Unknown fields inside a block (sasl, tls) are
// problems; unknown top-level fields are left to ConnectorOptions.Finish.
func decodeOptions(o *pipeline.ConnectorOptions, fields map[string]any) {
	for k, dst := range fields {
		v, ok := o.Raw(k)
		if !ok {
			continue
		}
		switch k {
		case "topics":
			if s, isStr := v.(string); isStr { // one topic
				v = []string{s}
			}
		case "brokers":
			if s, isStr := v.(string); isStr { // "h1:9092,h2:9092"
				v = strings.Split(s, ",")
			}
		}
		b, err := json.Marshal(v)
		if err != nil {
			o.Fail(k, "%v", err)
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(dst); err != nil {
			o.Fail(k, "%s", strings.TrimPrefix(err.Error(), "json: "))
		}
	}
}

func configFields(c *Config) map[string]any {
	return map[string]any{
		"brokers": &c.Brokers, "client_id": &c.ClientID, "sasl": &c.SASL, "tls": &c.TLS,
		"request_timeout": &c.RequestTimeout,
	}
}

// resolvePaths makes the TLS files relative to the spec file's directory.
func resolvePaths(c *Config, env *pipeline.Env) {
	if c.TLS == nil || env == nil {
		return
	}
	for _, p := range []*string{&c.TLS.CAFile, &c.TLS.CertFile, &c.TLS.KeyFile} {
		if *p != "" {
			*p = env.Path(*p)
		}
	}
}

// configProblem turns a Validate error into a problem on its field.
func configProblem(o *pipeline.ConnectorOptions, err error) {
	msg := err.Error()
	if e, ok := errors.AsType[*Error](err); ok && e.Kind == ErrConfig && e.Err != nil {
		msg = e.Err.Error()
	}
	field, reason, ok := strings.Cut(msg, ": ")
	if !ok || strings.ContainsAny(field, " ") {
		o.Fail("brokers", "%s", msg)
		return
	}
	o.Fail(field, "%s", reason)
}

// pipelineSource is a `type: kafka` source.
type pipelineSource struct {
	cfg     SourceConfig
	bounded bool
	job     string // tenant/job: the key of its group offsets in jobOffsets
}

// jobOffsets holds, per job (tenant/job) and consumer group, the positions the job's kafka
// source readers in this process recorded at their last barrier. A reader records them when
// the runtime takes its positions for checkpoint n; the exactly-once sink's subtask 0
// pre-commits n after every source subtask did (barrier n reaches a sink only through all of
// them) and before any records n+1 (one checkpoint is in flight at a time), so what it finds
// here is exactly checkpoint n's positions, and it commits them to the group inside its
// transaction of n. Sources in other processes (scale-out workers) are not seen: their
// offsets are in the checkpoint record only.
var jobOffsets struct {
	sync.Mutex
	m map[string]map[string]Positions
}

func recordOffsets(job, group string, pos Positions) {
	jobOffsets.Lock()
	defer jobOffsets.Unlock()
	if jobOffsets.m == nil {
		jobOffsets.m = map[string]map[string]Positions{}
	}
	g := jobOffsets.m[job]
	if g == nil {
		g = map[string]Positions{}
		jobOffsets.m[job] = g
	}
	if g[group] == nil {
		g[group] = Positions{}
	}
	maps.Copy(g[group], pos)
}

func groupOffsets(job string) map[string]Positions {
	jobOffsets.Lock()
	defer jobOffsets.Unlock()
	out := map[string]Positions{}
	for g, p := range jobOffsets.m[job] {
		out[g] = p.Clone()
	}
	return out
}

// NewPipelineSource builds a kafka source from its spec fields (docs/pipeline-spec.md): the
// Config fields, topics or pattern, start_from, group, read_uncommitted, value, key_field,
// fetch_max_bytes, and stop_at (latest: the source ends at the partitions' ends when it
// opens). Event time and watermarks are the source's event_time; without event_time.field
// a record's event time is its Kafka timestamp.
func NewPipelineSource(spec *pipeline.SourceSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Source, error) {
	return newPipelineSource(spec, o, env, nil)
}

func newPipelineSource(spec *pipeline.SourceSpec, o *pipeline.ConnectorOptions, env *pipeline.Env, h *Hosted) (pipeline.Source, error) {
	var sc SourceConfig
	fields := configFields(&sc.Config)
	for k, v := range map[string]any{
		"topics": &sc.Topics, "pattern": &sc.Pattern, "start_from": &sc.StartFrom, "group": &sc.Group,
		"read_uncommitted": &sc.ReadUncommitted, "value": &sc.Value, "key_field": &sc.KeyField,
		"fetch_max_bytes": &sc.FetchMaxBytes,
	} {
		fields[k] = v
	}
	decodeOptions(o, fields)
	for _, k := range []string{"time_field", "max_out_of_orderness", "idle_timeout"} {
		if _, ok := o.Raw(k); ok {
			o.Fail(k, "a pipeline's Kafka source takes event time and watermarks from its event_time block (event_time.field, max_out_of_orderness, idle_timeout)")
		}
	}
	stopAt := o.String("stop_at", "never")
	if stopAt != "never" && stopAt != "latest" {
		o.Fail("stop_at", "%q is not one of never, latest", stopAt)
	}
	if h != nil {
		if !h.restrict(o, &sc.Config) {
			return nil, nil
		}
	} else {
		resolvePaths(&sc.Config, env)
	}
	if spec.EventTime != nil && spec.EventTime.Field != "" && sc.Value == "raw" {
		o.Fail("value", "raw values have no fields: event_time.field needs JSON values")
	}
	if err := sc.Validate(); err != nil {
		configProblem(o, err)
		return nil, nil
	}
	tenant, job := o.Job()
	return &pipelineSource{cfg: sc, bounded: stopAt == "latest", job: tenant + "/" + job}, nil
}

func (s *pipelineSource) Bounded() bool { return s.bounded }

func (s *pipelineSource) Splits(ctx context.Context) ([]string, error) {
	src, err := NewSource(s.cfg)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	splits, err := src.Splits(ctx)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(splits))
	for i, sp := range splits {
		ids[i] = sp.String()
	}
	return ids, nil
}

// ParseSplit parses a split ID ("topic/3").
func ParseSplit(id string) (Split, error) {
	i := strings.LastIndexByte(id, '/')
	if i <= 0 {
		return Split{}, fmt.Errorf("split %q is not topic/partition", id)
	}
	p, err := strconv.ParseInt(id[i+1:], 10, 32)
	if err != nil || p < 0 {
		return Split{}, fmt.Errorf("split %q is not topic/partition", id)
	}
	return Split{id[:i], int32(p)}, nil
}

func (s *pipelineSource) Open(ctx context.Context, splits []pipeline.Split) (pipeline.SourceReader, error) {
	r := &reader{index: map[Split]int{}, bounded: s.bounded, job: s.job, group: s.cfg.Group}
	from := Positions{}
	for i, ps := range splits {
		sp, err := ParseSplit(ps.ID)
		if err != nil {
			return nil, err
		}
		if ps.Position != nil {
			var off int64
			if err := json.Unmarshal(ps.Position, &off); err != nil || off < 0 {
				return nil, fmt.Errorf("split %s: position %s is not an offset", ps.ID, ps.Position)
			}
			from[sp] = off
		}
		r.splits = append(r.splits, sp)
		r.index[sp] = i
	}
	src, err := NewSource(s.cfg)
	if err != nil {
		return nil, err
	}
	if err := src.Open(ctx, r.splits, from); err != nil {
		src.Close()
		return nil, err
	}
	if s.bounded && len(r.splits) > 0 {
		end, err := src.EndOffsets(ctx, r.splits)
		if err != nil {
			src.Close()
			return nil, err
		}
		src.StopAt(end)
	}
	r.src = src
	return r, nil
}

// reader is one source subtask's reader: a Source over its partitions.
type reader struct {
	src     *Source
	splits  []Split
	index   map[Split]int
	bounded bool
	job     string
	group   string // the consumer group the sink commits these offsets to ("": none)
}

// readWait bounds how long a Read blocks, so that barriers go out promptly.
const readWait = 20 * time.Millisecond

func (r *reader) Read(ctx context.Context, buf []pipeline.SourceRecord) (int, error) {
	if r.bounded && (len(r.splits) == 0 || r.src.Done()) {
		return 0, io.EOF
	}
	recs, err := r.src.Poll(ctx, readWait, len(buf))
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil
		}
		return 0, err
	}
	for i := range recs {
		rec := &recs[i]
		buf[i] = pipeline.SourceRecord{Split: r.index[rec.Split], Value: rec.Value, Key: rec.Key,
			TS: rec.Time, HasTS: true, Pos: rec.Offset, Malformed: rec.Err}
		if rec.Err != nil {
			buf[i].Malformed = fmt.Errorf("%v@%d: %w", rec.Split, rec.Offset, rec.Err)
		}
	}
	return len(recs), nil
}

func (r *reader) Positions() []pipeline.Split {
	pos := r.src.Positions()
	if r.group != "" {
		recordOffsets(r.job, r.group, pos)
	}
	out := make([]pipeline.Split, len(r.splits))
	for i, sp := range r.splits {
		out[i] = pipeline.Split{ID: sp.String(), Position: json.RawMessage(strconv.FormatInt(pos[sp], 10))}
	}
	return out
}

func (r *reader) Close() error {
	r.src.Close()
	return nil
}

// pipelineSink is a `type: kafka` sink; in exactly-once mode it is its own DecidingSink.
type pipelineSink struct {
	cfg  SinkConfig
	job  string // Identity.Job: transactional_id_prefix, or [tenant.]job
	key  string // tenant/job, the key of the job's group offsets
	name string
	// keyField, if set, takes each output's Kafka key from this top-level field of its JSON
	// value instead of the record's emitted key.
	keyField string
	par      int

	mu      sync.Mutex
	writers map[int]*Sink // the open subtasks of this process, for Decide
	// closing holds the writers closed with a transaction pre-committed (the final
	// checkpoint's: the sink subtasks end before the runtime decides it). Decide closes them
	// once committed; the next Recover closes whatever an attempt that failed left.
	closing map[*Sink]bool

	// beforeCommit, if set (tests), runs before Decide commits a subtask's transaction; an
	// error leaves that transaction uncommitted (a crash in the middle of a decision).
	beforeCommit func(checkpoint uint64, subtask int) error
}

// NewPipelineSink builds a kafka sink from its spec fields (docs/pipeline-spec.md): the
// Config fields, topic, mode, marker_topic, transaction_timeout, max_buffered_records,
// key_field and transactional_id_prefix (default: the job's name, with its tenant).
func NewPipelineSink(spec *pipeline.SinkSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Sink, error) {
	return newPipelineSink(spec, o, env, nil)
}

func newPipelineSink(spec *pipeline.SinkSpec, o *pipeline.ConnectorOptions, env *pipeline.Env, h *Hosted) (pipeline.Sink, error) {
	var sc SinkConfig
	fields := configFields(&sc.Config)
	for k, v := range map[string]any{
		"topic": &sc.Topic, "mode": &sc.Mode, "marker_topic": &sc.MarkerTopic,
		"transaction_timeout": &sc.TransactionTimeout, "max_buffered_records": &sc.MaxBufferedRecords,
	} {
		fields[k] = v
	}
	decodeOptions(o, fields)
	tenant, job := o.Job()
	key := tenant + "/" + job
	if tenant != "" {
		job = tenant + "." + job
	}
	if h != nil {
		// A tenant's transactional IDs and marker topic are its own: another prefix, or a
		// marker topic of its choosing, could fence or erase another tenant's.
		for _, k := range []string{"transactional_id_prefix", "marker_topic"} {
			if _, ok := o.Raw(k); ok {
				o.Fail(k, "set by the server on hosted pipelines (from the tenant and the pipeline): leave it out")
			}
		}
		if !h.restrict(o, &sc.Config) {
			return nil, nil
		}
	} else {
		job = o.String("transactional_id_prefix", job)
		resolvePaths(&sc.Config, env)
	}
	keyField := o.String("key_field", "")
	if err := sc.Validate(); err != nil {
		configProblem(o, err)
		return nil, nil
	}
	par := max(spec.Parallelism, 1)
	if err := (Identity{Job: job, Sink: spec.Name, Subtask: 0, Parallelism: par}).validate(); err != nil {
		o.Fail("transactional_id_prefix", "%q with sink %q: transactional IDs and the marker topic are made of [a-zA-Z0-9._-]", job, spec.Name)
		return nil, nil
	}
	return &pipelineSink{cfg: sc, job: job, key: key, keyField: keyField, name: spec.Name, par: par, writers: map[int]*Sink{}, closing: map[*Sink]bool{}}, nil
}

// Committer implements pipeline.Sink: the sink itself in exactly-once mode; nil at least
// once (outputs are flushed at every checkpoint and written again after a restore).
func (s *pipelineSink) Committer() pipeline.SinkCommitter {
	if !s.cfg.exactlyOnce() {
		return nil
	}
	return s
}

func (s *pipelineSink) identity(subtask, par int) Identity {
	return Identity{Job: s.job, Sink: s.name, Subtask: subtask, Parallelism: par}
}

func (s *pipelineSink) Open(ctx context.Context, sc pipeline.SinkContext) (pipeline.SinkWriter, error) {
	ks, err := NewSink(ctx, s.cfg, s.identity(sc.Subtask, sc.Parallelism), sc.Checkpoint+1)
	if err != nil {
		return nil, err
	}
	w := &writer{s: s, ks: ks, subtask: sc.Subtask}
	if s.cfg.exactlyOnce() {
		s.mu.Lock()
		s.writers[sc.Subtask] = ks
		s.mu.Unlock()
	}
	return w, nil
}

type writer struct {
	s       *pipelineSink
	ks      *Sink
	subtask int
}

func (w *writer) Write(ctx context.Context, recs []pipeline.SinkRecord) error {
	for i := range recs {
		r := &recs[i]
		k := r.Key
		if f := w.s.keyField; f != "" {
			raw, ok, err := topField(r.Value, f)
			if err == nil && !ok {
				err = errors.New("no such field")
			}
			if err == nil {
				k, err = keyBytes(raw)
			}
			if err != nil {
				return fmt.Errorf("kafka sink %s: key_field %q of output %.100q: %w", w.s.name, f, r.Value, err)
			}
		}
		// The runtime reuses its buffers once Write returns; the producer sends later.
		b := make([]byte, len(k)+len(r.Value))
		copy(b, k)
		copy(b[len(k):], r.Value)
		var key []byte
		if k != nil {
			key = b[:len(k):len(k)]
		}
		if err := w.ks.Write(ctx, Output{Key: key, Value: b[len(k):], Time: r.TS}); err != nil {
			return err
		}
	}
	return nil
}

func (w *writer) PreCommit(ctx context.Context, checkpoint uint64) ([]byte, error) {
	m := Marker{Epoch: checkpoint, Manifest: recordName(checkpoint)}
	if w.subtask == 0 {
		m.Groups = groupOffsets(w.s.key)
	}
	p, err := w.ks.PreCommit(ctx, m)
	if err != nil {
		return nil, err
	}
	return json.Marshal(p)
}

func (w *writer) Close(ctx context.Context) error {
	w.s.mu.Lock()
	if w.s.writers[w.subtask] == w.ks {
		if w.ks.pendingEpoch() != 0 {
			w.s.closing[w.ks] = true // Decide commits, then closes it
			w.s.mu.Unlock()
			return nil
		}
		delete(w.s.writers, w.subtask)
	}
	w.s.mu.Unlock()
	w.ks.Close()
	return nil
}

// closeStale closes the writers of earlier attempts (Recover runs before any of this
// attempt's opens).
func (s *pipelineSink) closeStale() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, ks := range s.writers {
		ks.Close()
		delete(s.writers, i)
	}
	clear(s.closing)
}

var decideHook atomic.Pointer[func(checkpoint uint64, subtask int)]

// SetDecideHook installs f, called in Decide after each subtask's transaction committed (nil
// removes it): fault injection, for the CLI's crash test to SIGKILL the process in the middle
// of a decision.
func SetDecideHook(f func(checkpoint uint64, subtask int)) {
	if f == nil {
		decideHook.Store(nil)
		return
	}
	decideHook.Store(&f)
}

// recordName is the name the runtime gives checkpoint record n (host/pipeline's jobstore):
// the marker names it. Decide checks that the runtime's name is this one.
func recordName(n uint64) string { return fmt.Sprintf("%020d.json", n) }

// preparedPart is the sink's part of a checkpoint record.
type preparedPart struct {
	Job         string     `json:"job"`
	Parallelism int        `json:"parallelism"`
	Subtasks    []Prepared `json:"subtasks"`
}

func decodePrepared(b []byte) (*preparedPart, error) {
	if b == nil {
		return nil, nil
	}
	var p preparedPart
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, &Error{Op: "recover", Kind: ErrInvariant, Err: fmt.Errorf("the checkpoint's kafka sink part: %w", err)}
	}
	return &p, nil
}

// Prepare implements pipeline.SinkCommitter.
func (s *pipelineSink) Prepare(ctx context.Context, checkpoint uint64, handles [][]byte) ([]byte, error) {
	p := preparedPart{Job: s.job, Parallelism: len(handles)}
	for i, h := range handles {
		var sp Prepared
		if err := json.Unmarshal(h, &sp); err != nil {
			return nil, fmt.Errorf("subtask %d's handle: %w", i, err)
		}
		if sp.Epoch != checkpoint || sp.Subtask != i || sp.TransactionalID == "" {
			return nil, &Error{Op: "prepare", Kind: ErrInvariant, Err: fmt.Errorf("subtask %d pre-committed %+v for checkpoint %d", i, sp, checkpoint)}
		}
		p.Subtasks = append(p.Subtasks, sp)
	}
	return json.Marshal(p)
}

// Decide implements pipeline.DecidingSink: it commits every subtask's transaction of the
// checkpoint, in parallel. Once one has committed the checkpoint is decided (Recover
// finishes the others after a crash).
func (s *pipelineSink) Decide(ctx context.Context, checkpoint uint64, record string, prepared []byte) error {
	if record != recordName(checkpoint) {
		return &Error{Op: "decide", Kind: ErrInvariant, Err: fmt.Errorf("checkpoint %d's record is %q, but the markers name %q", checkpoint, record, recordName(checkpoint))}
	}
	p, err := decodePrepared(prepared)
	if err != nil {
		return err
	}
	s.mu.Lock()
	sinks := make([]*Sink, len(p.Subtasks))
	for i, sp := range p.Subtasks {
		sinks[i] = s.writers[sp.Subtask]
	}
	s.mu.Unlock()
	errs := make([]error, len(sinks))
	var wg sync.WaitGroup
	for i, ks := range sinks {
		if ks == nil {
			errs[i] = fmt.Errorf("subtask %d is not open in this process", p.Subtasks[i].Subtask)
			continue
		}
		wg.Go(func() {
			if s.beforeCommit != nil {
				if errs[i] = s.beforeCommit(checkpoint, p.Subtasks[i].Subtask); errs[i] != nil {
					return
				}
			}
			errs[i] = ks.Commit(ctx, checkpoint)
			if h := decideHook.Load(); h != nil && errs[i] == nil {
				(*h)(checkpoint, p.Subtasks[i].Subtask)
			}
		})
	}
	wg.Wait()
	s.mu.Lock()
	for i, ks := range sinks {
		if ks != nil && errs[i] == nil && s.closing[ks] {
			delete(s.closing, ks)
			if s.writers[p.Subtasks[i].Subtask] == ks {
				delete(s.writers, p.Subtasks[i].Subtask)
			}
			ks.Close()
		}
	}
	s.mu.Unlock()
	return errors.Join(errs...)
}

// Commit implements pipeline.SinkCommitter: Decide committed everything already.
func (s *pipelineSink) Commit(ctx context.Context, checkpoint uint64, prepared []byte) error {
	return nil
}

// subtasks returns how many subtasks the sink has ever had: the marker topic has one
// partition per subtask (0 if it does not exist: nothing was ever committed).
func (s *pipelineSink) subtasks(ctx context.Context, admin *kgo.Client) (int, error) {
	topic := s.cfg.markerTopic(s.identity(0, s.par))
	counts, err := describe(ctx, admin, s.cfg.Config, []string{topic})
	if errors.Is(err, ErrMissingTopic) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return int(counts[topic]), nil
}

// markers returns each subtask's last committed marker (found false: none).
func (s *pipelineSink) markers(ctx context.Context, admin *kgo.Client, n int) ([]markerValue, []bool, error) {
	ms, found := make([]markerValue, n), make([]bool, n)
	if n == 0 {
		return ms, found, nil
	}
	topic := s.cfg.markerTopic(s.identity(0, n))
	for i := range n {
		m, ok, err := lastMarker(ctx, admin, s.cfg.Config, topic, s.identity(i, n))
		if err != nil {
			return nil, nil, err
		}
		ms[i], found[i] = m, ok
	}
	return ms, found, nil
}

// waitCommits waits while a transaction of the sink is between its EndTxn and its markers
// (PrepareCommit, PrepareAbort): an in-doubt commit of a crashed run is then decided, and
// the markers read next show it.
func (s *pipelineSink) waitCommits(ctx context.Context, admin *kgo.Client, n int) error {
	var ids []string
	for i := range n {
		ids = append(ids, s.identity(i, n).TransactionalID(0), s.identity(i, n).TransactionalID(1))
	}
	if len(ids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.requestTimeout())
	defer cancel()
	for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		txns, err := kadm.NewClient(admin).DescribeTransactions(ctx, ids...)
		if err != nil {
			return brokersErr(s.cfg.Config, classify("describe transactions", err))
		}
		busy := ""
		for _, t := range txns {
			if t.Err == nil && strings.HasPrefix(t.State, "Prepare") {
				busy = t.TxnID + " is " + t.State
			}
		}
		if busy == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return &Error{Op: "recover", Kind: ErrUnreachable, Retryable: true, Err: fmt.Errorf("%s for longer than the request timeout", busy)}
		case <-time.After(backoff):
		}
	}
}

// Decided implements pipeline.DecidingSink: the newest checkpoint that some subtask's
// committed marker names. It is called only to restore, with the crashed run's sinks
// stopped.
func (s *pipelineSink) Decided(ctx context.Context) (uint64, error) {
	admin, err := s.cfg.newClient()
	if err != nil {
		return 0, err
	}
	defer admin.Close()
	n, err := s.subtasks(ctx, admin)
	if err != nil {
		return 0, err
	}
	if err := s.waitCommits(ctx, admin, n); err != nil {
		return 0, err
	}
	ms, found, err := s.markers(ctx, admin, n)
	if err != nil {
		return 0, err
	}
	var newest uint64
	for i := range ms {
		if found[i] {
			newest = max(newest, ms[i].Epoch)
		}
	}
	return newest, nil
}

// Recover implements pipeline.SinkCommitter. The runtime restores checkpoint c (0: a fresh
// start) after rolling forward whatever Decided named, so:
//
//   - a subtask of c whose marker is not committed has its transaction of c committed from
//     the record (another subtask's commit decided c);
//   - every transactional ID of the sink is fenced: any transaction after c aborts, and an
//     older incarnation of a subtask can no longer write;
//   - then every subtask of c must have committed c, and no marker may name a later
//     checkpoint (restoring an older checkpoint than the newest whose outputs are committed
//     would write them again); a fresh start deletes the markers of earlier runs instead.
func (s *pipelineSink) Recover(ctx context.Context, checkpoint uint64, prepared []byte) error {
	s.closeStale()
	p, err := decodePrepared(prepared)
	if err != nil {
		return err
	}
	admin, err := s.cfg.newClient()
	if err != nil {
		return err
	}
	defer admin.Close()
	n, err := s.subtasks(ctx, admin)
	if err != nil {
		return err
	}
	if p != nil {
		n = max(n, p.Parallelism)
	}
	resumeErrs := map[int]error{}
	if p != nil {
		if err := s.waitCommits(ctx, admin, n); err != nil {
			return err
		}
		ms, found, err := s.markers(ctx, admin, n)
		if err != nil {
			return err
		}
		for _, sp := range p.Subtasks {
			if sp.Subtask < len(ms) && found[sp.Subtask] && ms[sp.Subtask].Epoch >= checkpoint {
				continue
			}
			resumeErrs[sp.Subtask] = resumeCommit(ctx, admin, s.cfg.Config, sp)
		}
	}
	for i := range max(n, s.par) {
		for slot := range 2 {
			if err := fence(ctx, admin, s.cfg, s.identity(i, n).TransactionalID(slot)); err != nil {
				return err
			}
		}
	}
	ms, found, err := s.markers(ctx, admin, n)
	if err != nil {
		return err
	}
	if p != nil {
		var errs []error
		for _, sp := range p.Subtasks {
			if found[sp.Subtask] && ms[sp.Subtask].Epoch >= checkpoint {
				continue
			}
			errs = append(errs, fmt.Errorf("subtask %d (%s): %v", sp.Subtask, sp.TransactionalID, resumeErrs[sp.Subtask]))
		}
		if len(errs) > 0 {
			return &Error{Op: "recover", Kind: ErrPartialCommit, Err: fmt.Errorf("checkpoint %d of sink %s: %w", checkpoint, s.name, errors.Join(errs...))}
		}
	}
	var newest uint64
	for i := range ms {
		if found[i] {
			newest = max(newest, ms[i].Epoch)
		}
	}
	if newest <= checkpoint {
		return nil
	}
	if checkpoint == 0 {
		return s.forgetMarkers(ctx, admin)
	}
	return &Error{Op: "recover", Kind: ErrInvariant, Err: fmt.Errorf(
		"sink %s: checkpoint %d's outputs are committed to %s, and the job restores the older checkpoint %d, which would write them again: restore the latest checkpoint, or start fresh",
		s.name, newest, s.cfg.Topic, checkpoint)}
}

// forgetMarkers deletes every marker of the sink (a fresh start: the markers of an earlier
// run, whose checkpoint records are gone, must not decide this run's checkpoints).
func (s *pipelineSink) forgetMarkers(ctx context.Context, admin *kgo.Client) error {
	topic := s.cfg.markerTopic(s.identity(0, s.par))
	ctx, cancel := context.WithTimeout(ctx, s.cfg.requestTimeout())
	defer cancel()
	ends, err := kadm.NewClient(admin).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return brokersErr(s.cfg.Config, classify("list marker offsets", err))
	}
	resp, err := kadm.NewClient(admin).DeleteRecords(ctx, ends.Offsets())
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return brokersErr(s.cfg.Config, classify("delete old markers", err))
	}
	return nil
}
