package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/clink-wasm/clink-wasm/internal/jsonfield"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// SourceConfig is a Kafka source in a pipeline spec.
type SourceConfig struct {
	Config `json:",inline" yaml:",inline"`
	// Topics to read, or Pattern, a regular expression over topic names (resolved when the
	// splits are listed). Exactly one is set.
	Topics  []string `json:"topics,omitempty" yaml:"topics,omitempty"`
	Pattern string   `json:"pattern,omitempty" yaml:"pattern,omitempty"`
	// StartFrom is where a split starts when the checkpoint has no position for it (a first
	// run, or a partition added since): "earliest" (default), "latest", or "committed" (the
	// Group's committed offset, else earliest). A restored position always wins: reading
	// restarts at the checkpoint's offsets, never at the group's.
	StartFrom string `json:"start_from,omitempty" yaml:"start_from,omitempty"`
	// Group names the consumer group whose offsets StartFrom "committed" reads and to which an
	// exactly-once sink commits the source's offsets inside its transactions (so that Kafka
	// tools show the pipeline's lag). The source never joins the group: splits are assigned
	// by the pipeline.
	Group string `json:"group,omitempty" yaml:"group,omitempty"`
	// ReadUncommitted reads records of open and aborted transactions too. The default is
	// read_committed.
	ReadUncommitted bool `json:"read_uncommitted,omitempty" yaml:"read_uncommitted,omitempty"`
	// Value is "json" (default: each value must be one JSON document) or "raw" (bytes for
	// operators that parse their own).
	Value string `json:"value,omitempty" yaml:"value,omitempty"`
	// KeyField, if set, takes the key from this top-level field of the JSON value; otherwise
	// the key is the Kafka record key.
	KeyField string `json:"key_field,omitempty" yaml:"key_field,omitempty"`
	// TimeField, if set, takes event time from this top-level field (epoch ms or RFC 3339);
	// otherwise event time is the Kafka record timestamp.
	TimeField string `json:"time_field,omitempty" yaml:"time_field,omitempty"`
	// MaxOutOfOrder bounds how late (in event time) a record may come after a later one of
	// its partition and still be on time.
	MaxOutOfOrder Duration `json:"max_out_of_orderness,omitempty" yaml:"max_out_of_orderness,omitempty"`
	// IdleTimeout: a partition without a record for this long (processing time) stops
	// holding the watermark back. Zero means partitions never go idle.
	IdleTimeout Duration `json:"idle_timeout,omitempty" yaml:"idle_timeout,omitempty"`
	// FetchMaxBytes bounds one fetch response, and so (times the brokers) the memory the
	// source buffers. Zero means 16 MiB.
	FetchMaxBytes int32 `json:"fetch_max_bytes,omitempty" yaml:"fetch_max_bytes,omitempty"`
}

// Validate checks the source's configuration.
func (sc SourceConfig) Validate() error {
	if err := sc.Config.Validate(); err != nil {
		return err
	}
	if (len(sc.Topics) == 0) == (sc.Pattern == "") {
		return configErr("topics", "exactly one of topics and pattern is required")
	}
	for i, t := range sc.Topics {
		if !topicName.MatchString(t) {
			return configErr(fmt.Sprintf("topics[%d]", i), "%q is not a topic name", t)
		}
	}
	if sc.Pattern != "" {
		if _, err := regexp.Compile(sc.Pattern); err != nil {
			return configErr("pattern", "%v", err)
		}
	}
	switch sc.StartFrom {
	case "", "earliest", "latest":
	case "committed":
		if sc.Group == "" {
			return configErr("start_from", "committed needs a group")
		}
	default:
		return configErr("start_from", "%q is not one of earliest, latest, committed", sc.StartFrom)
	}
	switch sc.Value {
	case "", "json":
	case "raw":
		if sc.KeyField != "" || sc.TimeField != "" {
			return configErr("value", "key_field and time_field need JSON values")
		}
	default:
		return configErr("value", "%q is not one of json, raw", sc.Value)
	}
	if sc.MaxOutOfOrder < 0 || sc.IdleTimeout < 0 || sc.FetchMaxBytes < 0 {
		return configErr("max_out_of_orderness", "durations and sizes must not be negative")
	}
	return nil
}

// Record is one input record.
type Record struct {
	Split  Split
	Offset int64
	Key    []byte
	Value  []byte
	Time   int64 // event time, epoch ms
	// Err is set when the record does not fit the configuration (a value that is not JSON,
	// a missing key or time field). Its position is consumed like any other's, so the
	// pipeline decides: dead-letter it, or fail naming Split and Offset.
	Err error
}

// Source reads a set of splits (the partitions assigned to one source subtask) from given
// positions. Its Positions are what a checkpoint stores; its Watermark is what the pipeline
// forwards. It is not safe for concurrent use except Positions, which may be called from
// the checkpoint path while Poll runs.
type Source struct {
	cfg    SourceConfig
	re     *regexp.Regexp
	cl     *kgo.Client // the consumer, made with the first splits
	adm    *kgo.Client // metadata and offsets
	opened bool

	mu  sync.Mutex
	pos Positions // next offset per assigned split; INVARIANT: covers every assigned split
	// stop, if set (StopAt), is where each split ends: records at or after it are not
	// returned and its position never passes it.
	stop Positions
	wm   *Watermarks // guarded by mu too: Positions and Watermark may run beside Poll

	now func() time.Time
}

// NewSource validates sc and connects (lazily: the first request reports an unreachable
// cluster).
func NewSource(sc SourceConfig) (*Source, error) {
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	s := &Source{cfg: sc, now: time.Now, wm: NewWatermarks(time.Duration(sc.MaxOutOfOrder), time.Duration(sc.IdleTimeout))}
	if sc.Pattern != "" {
		s.re = regexp.MustCompile(sc.Pattern)
	}
	var err error
	if s.adm, err = sc.newClient(); err != nil {
		return nil, err
	}
	return s, nil
}

// Splits lists every partition of the configured topics (or of the topics matching the
// pattern now). A missing topic is ErrMissingTopic.
func (s *Source) Splits(ctx context.Context) ([]Split, error) {
	var (
		counts map[string]int32
		err    error
	)
	if s.re != nil {
		counts, err = matching(ctx, s.adm, s.cfg.Config, s.re)
	} else {
		counts, err = describe(ctx, s.adm, s.cfg.Config, s.cfg.Topics)
	}
	if err != nil {
		return nil, err
	}
	var out []Split
	for t, n := range counts {
		for p := range n {
			out = append(out, Split{t, p})
		}
	}
	SortSplits(out)
	return out, nil
}

// Open starts reading splits. A split with a position in from starts there (the restore
// path); any other starts as StartFrom says, resolved to a concrete offset now, so that
// Positions is exact from the first checkpoint on.
func (s *Source) Open(ctx context.Context, splits []Split, from Positions) error {
	if s.opened {
		return errors.New("kafka source: Open called twice")
	}
	s.opened = true
	s.mu.Lock()
	s.pos = Positions{}
	s.mu.Unlock()
	return s.AddSplits(ctx, splits, from)
}

// AddSplits starts reading more splits (a partition assigned to this subtask, or one that
// appeared under the pattern), each from its position in from or as StartFrom says.
func (s *Source) AddSplits(ctx context.Context, splits []Split, from Positions) error {
	if !s.opened {
		return errors.New("kafka source: AddSplits before Open")
	}
	pos := make(Positions, len(splits))
	var missing []Split
	s.mu.Lock()
	for _, sp := range splits {
		if _, dup := s.pos[sp]; dup {
			s.mu.Unlock()
			return fmt.Errorf("kafka source: split %v is already being read", sp)
		}
		if off, ok := from[sp]; ok {
			pos[sp] = off
		} else {
			missing = append(missing, sp)
		}
	}
	s.mu.Unlock()
	if len(pos) > 0 {
		if err := s.checkPositions(ctx, pos); err != nil {
			return err
		}
	}
	if len(missing) > 0 {
		if err := s.resolveStart(ctx, missing, pos); err != nil {
			return err
		}
	}
	if len(pos) == 0 {
		return nil
	}
	parts := map[string]map[int32]kgo.Offset{}
	for sp, off := range pos {
		if parts[sp.Topic] == nil {
			parts[sp.Topic] = map[int32]kgo.Offset{}
		}
		parts[sp.Topic][sp.Partition] = kgo.NewOffset().At(off)
	}
	if s.cl == nil {
		// A direct consumer only exists if it starts with partitions; so the client is made
		// with the first splits.
		fetchMax := s.cfg.FetchMaxBytes
		if fetchMax == 0 {
			fetchMax = 16 << 20
		}
		opts := []kgo.Opt{
			kgo.ConsumePartitions(parts),
			kgo.FetchMaxBytes(fetchMax),
			kgo.FetchMaxPartitionBytes(min(fetchMax, 1<<20)),
			kgo.BrokerMaxReadBytes(max(fetchMax*2, 100<<20)),
			// Transaction markers too, so that a position moves past them: a partition whose
			// log ends with a commit marker is then read to its end (StopAt, Done).
			kgo.KeepControlRecords(),
		}
		if !s.cfg.ReadUncommitted {
			opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
		}
		cl, err := s.cfg.newClient(opts...)
		if err != nil {
			return err
		}
		s.cl = cl
	} else {
		s.cl.AddConsumePartitions(parts)
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for sp, off := range pos {
		s.wm.Add(sp, now)
		s.pos[sp] = off
	}
	return nil
}

// RemoveSplits stops reading splits (revoked from this subtask) and returns their
// positions: everything before them has been returned by Poll, nothing after.
func (s *Source) RemoveSplits(splits []Split) Positions {
	out := Positions{}
	rm := map[string][]int32{}
	s.mu.Lock()
	for _, sp := range splits {
		if off, ok := s.pos[sp]; ok {
			out[sp] = off
			delete(s.pos, sp)
			s.wm.Remove(sp)
			rm[sp.Topic] = append(rm[sp.Topic], sp.Partition)
		}
	}
	s.mu.Unlock()
	if s.cl != nil && len(rm) > 0 {
		s.cl.RemoveConsumePartitions(rm)
	}
	return out
}

// checkPositions makes sure every restored position lies within its partition's log, from
// the log start to the high watermark, instead of letting the consumer reset silently.
func (s *Source) checkPositions(ctx context.Context, pos Positions) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.requestTimeout())
	defer cancel()
	topics := slices.Compact(slices.Sorted(func(yield func(string) bool) {
		for sp := range pos {
			if !yield(sp.Topic) {
				return
			}
		}
	}))
	adm := kadm.NewClient(s.adm)
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err == nil {
		err = starts.Error()
	}
	var ends kadm.ListedOffsets
	if err == nil {
		ends, err = adm.ListEndOffsets(ctx, topics...)
	}
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return brokersErr(s.cfg.Config, classify("list offsets", err))
	}
	for sp, off := range pos {
		lo, ok1 := starts.Lookup(sp.Topic, sp.Partition)
		hi, ok2 := ends.Lookup(sp.Topic, sp.Partition)
		if !ok1 || !ok2 {
			return &Error{Op: "open", Kind: ErrMissingTopic, Err: fmt.Errorf("partition %v of the checkpoint", sp)}
		}
		if off < lo.Offset || off > hi.Offset {
			return &Error{Op: "open", Kind: ErrPositionLost, Err: fmt.Errorf(
				"%v: the checkpoint's position %d is outside the log [%d, %d] (retention deleted records the checkpoint had not read, or the topic was recreated)",
				sp, off, lo.Offset, hi.Offset)}
		}
	}
	return nil
}

func (s *Source) resolveStart(ctx context.Context, splits []Split, pos Positions) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.requestTimeout())
	defer cancel()
	adm := kadm.NewClient(s.adm)
	topics := slices.Compact(slices.Sorted(func(yield func(string) bool) {
		for _, sp := range splits {
			if !yield(sp.Topic) {
				return
			}
		}
	}))
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return brokersErr(s.cfg.Config, classify("list offsets", err))
	}
	var (
		ends      kadm.ListedOffsets
		committed kadm.OffsetResponses
	)
	switch s.cfg.StartFrom {
	case "latest":
		if s.cfg.ReadUncommitted {
			ends, err = adm.ListEndOffsets(ctx, topics...)
		} else {
			ends, err = adm.ListCommittedOffsets(ctx, topics...)
		}
		if err == nil {
			err = ends.Error()
		}
	case "committed":
		committed, err = adm.FetchOffsets(ctx, s.cfg.Group)
		if err == nil {
			err = committed.Error()
		}
	}
	if err != nil {
		return brokersErr(s.cfg.Config, classify("list offsets", err))
	}
	for _, sp := range splits {
		lo, ok := starts.Lookup(sp.Topic, sp.Partition)
		if !ok {
			return &Error{Op: "list offsets", Kind: ErrMissingTopic, Err: fmt.Errorf("partition %v", sp)}
		}
		off := lo.Offset
		switch s.cfg.StartFrom {
		case "latest":
			if e, ok := ends.Lookup(sp.Topic, sp.Partition); ok {
				off = e.Offset
			}
		case "committed":
			if c, ok := committed.Lookup(sp.Topic, sp.Partition); ok && c.At >= off {
				off = c.At
			}
		}
		pos[sp] = off
	}
	return nil
}

// Poll returns the next records, waiting at most wait for the first one (so that the caller
// gets control back to advance idle watermarks). It returns at most max records. A fetch
// error is classified; a cancelled ctx returns its error.
func (s *Source) Poll(ctx context.Context, wait time.Duration, max int) ([]Record, error) {
	if !s.opened {
		return nil, errors.New("kafka source: Poll before Open")
	}
	if s.cl == nil { // no split yet
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
			return nil, nil
		}
	}
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	fs := s.cl.PollRecords(pctx, max)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var ferr error
	fs.EachError(func(t string, p int32, err error) {
		if ferr == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			ferr = brokersErr(s.cfg.Config, classify("fetch", fmt.Errorf("%s/%d: %w", t, p, err)))
		}
	})
	if ferr != nil {
		return nil, ferr
	}
	now := s.now()
	out := make([]Record, 0, fs.NumRecords())
	s.mu.Lock()
	defer s.mu.Unlock()
	// Per partition, not per record: one position update and one watermark update for each
	// partition's run of records.
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		sp := Split{p.Topic, p.Partition}
		if _, ok := s.pos[sp]; !ok {
			return // fetched before RemoveSplits: no longer ours
		}
		maxTime, seen := int64(0), false
		stop, bounded := s.stop[sp]
		next := s.pos[sp]
		for _, r := range p.Records {
			if bounded && r.Offset >= stop {
				break
			}
			next = r.Offset + 1
			if r.Attrs.IsControl() {
				continue
			}
			rec := Record{Split: sp, Offset: r.Offset, Key: r.Key, Value: r.Value, Time: r.Timestamp.UnixMilli()}
			s.decode(&rec)
			if rec.Err == nil && (!seen || rec.Time > maxTime) {
				maxTime, seen = rec.Time, true
			}
			out = append(out, rec)
		}
		if seen {
			s.wm.Observe(sp, maxTime, now)
		}
		s.pos[sp] = next
	})
	return out, nil
}

func (s *Source) decode(r *Record) {
	if s.cfg.Value == "raw" {
		return
	}
	if !jsonfield.Valid(r.Value) {
		r.Err = errors.New("the value is not JSON")
		return
	}
	if f := s.cfg.KeyField; f != "" {
		var err error
		if r.Key, err = field(r.Value, f, "key", jsonfield.Key); err != nil {
			r.Err = err
			return
		}
	}
	if f := s.cfg.TimeField; f != "" {
		var err error
		if r.Time, err = field(r.Value, f, "time", jsonfield.Time); err != nil {
			r.Err = err
		}
	}
}

// StopAt makes the source bounded: each split in end stops there (the offsets EndOffsets
// returns, typically), and Done reports when every split has reached its end.
func (s *Source) StopAt(end Positions) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stop = end.Clone()
}

// EndOffsets returns the current end of each split: the last stable offset when reading
// committed records (so that a transaction still open is not waited for), else the high
// watermark.
func (s *Source) EndOffsets(ctx context.Context, splits []Split) (Positions, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.requestTimeout())
	defer cancel()
	topics := slices.Compact(slices.Sorted(func(yield func(string) bool) {
		for _, sp := range splits {
			if !yield(sp.Topic) {
				return
			}
		}
	}))
	adm := kadm.NewClient(s.adm)
	var (
		ends kadm.ListedOffsets
		err  error
	)
	if s.cfg.ReadUncommitted {
		ends, err = adm.ListEndOffsets(ctx, topics...)
	} else {
		ends, err = adm.ListCommittedOffsets(ctx, topics...)
	}
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, brokersErr(s.cfg.Config, classify("list end offsets", err))
	}
	out := make(Positions, len(splits))
	for _, sp := range splits {
		e, ok := ends.Lookup(sp.Topic, sp.Partition)
		if !ok {
			return nil, &Error{Op: "list end offsets", Kind: ErrMissingTopic, Err: fmt.Errorf("partition %v", sp)}
		}
		out[sp] = e.Offset
	}
	return out, nil
}

// Done reports whether every split has reached its StopAt offset (false without StopAt).
func (s *Source) Done() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop == nil {
		return false
	}
	for sp, off := range s.pos {
		if end, ok := s.stop[sp]; !ok || off < end {
			return false
		}
	}
	return true
}

// Positions returns a copy of the next offset of every assigned split: the source's part of
// a checkpoint taken after the records Poll has returned so far.
func (s *Source) Positions() Positions {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.pos)
}

// Watermark returns the source's watermark (epoch ms, or NoWatermark) and whether all its
// splits are idle.
func (s *Source) Watermark() (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wm.Current(s.now())
}

// SplitWatermark returns the watermark of one split.
func (s *Source) SplitWatermark(sp Split) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wm.Split(sp)
}

// Close stops reading.
func (s *Source) Close() {
	if s.cl != nil {
		s.cl.Close()
	}
	s.adm.Close()
}

// field parses the top-level field f of the JSON object v with parse; the error names the
// field and what it is for (the key or the event time).
func field[T any](v []byte, f, what string, parse func(json.RawMessage) (T, error)) (T, error) {
	var x T
	raw, ok, err := jsonfield.Top(v, f)
	if err == nil && !ok {
		err = fmt.Errorf("no %s field %q", what, f)
	}
	if err == nil {
		x, err = parse(raw)
	}
	if err != nil {
		return x, fmt.Errorf("%s field %q: %w", what, f, err)
	}
	return x, nil
}
