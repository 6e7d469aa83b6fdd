package replay

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// Options configures a replay.
type Options struct {
	// Module is the .wasm to replay the recording with.
	Module []byte
	// Log receives guest log lines; nil discards them.
	Log io.Writer
	// MaxDetails bounds the differences and unrecorded reads and lookups the report describes
	// one by one (default 100); all are counted.
	MaxDetails int
	// CacheDir is wazero's compilation cache; "" keeps it in memory.
	CacheDir string
}

// ErrNotReplayable is the error for a recording that a replay cannot use as it is: one whose
// run did not finish.
var ErrNotReplayable = errors.New("recording cannot be replayed")

// ModuleRef names a module.
type ModuleRef struct {
	Operator string `json:"operator"`
	SHA256   string `json:"sha256"`
}

// Report is the outcome of a replay.
type Report struct {
	Dir      string    `json:"recording"`
	Recorded ModuleRef `json:"recorded_module"`
	Replayed ModuleRef `json:"replayed_module"`

	Records    int64 `json:"records"`
	Watermarks int64 `json:"watermarks"`
	// ExpectedOutputs and GotOutputs count output records, recorded and replayed.
	ExpectedOutputs int64 `json:"expected_outputs"`
	GotOutputs      int64 `json:"got_outputs"`

	// Differing counts the sources (records, timers) whose outputs differ; Diffs describes the
	// first MaxDetails of them in input order.
	Differing int64  `json:"differing"`
	Diffs     []Diff `json:"diffs,omitempty"`

	// Unrecorded counts the state reads and lookups the recording does not hold (each distinct
	// one once); they are described in UnrecordedReads and UnrecordedLookups.
	Unrecorded        int64              `json:"unrecorded"`
	UnrecordedReads   []UnrecordedRead   `json:"unrecorded_reads,omitempty"`
	UnrecordedLookups []UnrecordedLookup `json:"unrecorded_lookups,omitempty"`

	// Error is the replayed run's failure (a guest fault), if it failed.
	Error string `json:"error,omitempty"`
}

// Identical reports whether the replay reproduced the recorded run: the same outputs for every
// record and timer, every read and lookup served from the recording, and no failure.
func (r *Report) Identical() bool {
	return r.Differing == 0 && r.Unrecorded == 0 && r.Error == ""
}

// Diff is one record or timer whose outputs differ.
type Diff struct {
	Source   DiffSource `json:"source"`
	Expected []OutValue `json:"expected"`
	Got      []OutValue `json:"got"`
}

// DiffSource names what produced the outputs: a record (Pos, the key it had in the recorded
// run and in the replay), a timer (Timer, Key, TS), or neither (Outside: clink_open or
// clink_close).
type DiffSource struct {
	Pos      int64  `json:"pos,omitempty"`
	Key      Bytes  `json:"key"`
	GotKey   Bytes  `json:"got_key,omitempty"` // the replay's key, when it differs
	TS       int64  `json:"ts,omitempty"`
	Timer    bool   `json:"timer,omitempty"`
	Outside  bool   `json:"outside,omitempty"`
	Describe string `json:"describe"`
}

// OutValue is one output record.
type OutValue struct {
	Key   Bytes `json:"key"`
	Value Bytes `json:"value"`
	TS    int64 `json:"ts"`
}

// UnrecordedRead is a state read the recording does not hold.
type UnrecordedRead struct {
	State string `json:"state"`
	Key   Bytes  `json:"key"`
	Entry Bytes  `json:"entry,omitempty"`
}

// UnrecordedLookup is a lookup the recording does not hold.
type UnrecordedLookup struct {
	Endpoint string `json:"endpoint"`
	Request  Bytes  `json:"request"`
}

// Run replays the recording in dir with opts.Module. It needs no network and no state pool:
// every state read and lookup is answered from the recording. The replay is deterministic: it
// runs the production scheduler in its synchronous mode (one record at a time, in input order)
// and answers repeated identical lookups with the recorded responses in recorded order.
//
// An error means the replay could not be made (an unreadable recording, a module that does not
// load); differences are in the Report.
func Run(ctx context.Context, dir string, opts Options) (*Report, error) {
	man, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	switch man.Status {
	case StatusComplete:
	case StatusFailed:
		return nil, fmt.Errorf("%w: %s records a run that failed (%s); replay a run that finished", ErrNotReplayable, dir, man.Error.messageOr("no message"))
	case StatusTruncated:
		return nil, fmt.Errorf("%w: %s reached its size cap (%d bytes) and holds only the start of the run; record again with a larger --record-max-bytes", ErrNotReplayable, dir, man.MaxBytes)
	default:
		return nil, fmt.Errorf("%w: %s is still being recorded or its run died before it finished", ErrNotReplayable, dir)
	}
	if opts.MaxDetails <= 0 {
		opts.MaxDetails = 100
	}
	sum := sha256.Sum256(opts.Module)
	rep := &Report{Dir: dir, Recorded: ModuleRef{man.Operator, man.ModuleSHA256}}
	rep.Replayed.SHA256 = hex.EncodeToString(sum[:])
	un := &unrecorded{max: opts.MaxDetails, seen: map[string]bool{}}

	st, err := loadState(dir, man.StateOrigin == StateOriginEmpty, un)
	if err != nil {
		return nil, err
	}
	lk, err := loadLookups(dir, un)
	if err != nil {
		return nil, err
	}
	want, err := loadOutputs(dir)
	if err != nil {
		return nil, err
	}

	engOpts := []abi.EngineOption{abi.WithLimits(man.Limits)}
	if opts.CacheDir != "" {
		engOpts = append(engOpts, abi.WithCompilationCacheDir(opts.CacheDir))
	}
	eng, err := abi.NewEngine(ctx, engOpts...)
	if err != nil {
		return nil, err
	}
	defer eng.Close(context.WithoutCancel(ctx))
	names := make([]string, len(man.Endpoints))
	for i, e := range man.Endpoints {
		names[i] = e.Name
	}
	mod, err := eng.Load(ctx, opts.Module, abi.WithEndpoints(names...))
	if err != nil {
		return nil, fmt.Errorf("loading the module to replay (the recording has endpoints %q): %w", names, err)
	}
	rep.Replayed.Operator = mod.Name()
	order := map[string]scheduler.Order{"key": scheduler.OrderPerKey, "input": scheduler.OrderInput, "none": scheduler.OrderNone}[man.Order]

	var lookupFn scheduler.LookupFunc
	if len(man.Endpoints) > 0 {
		lk.declared = mod.Manifest.Endpoints
		lookupFn = lk.do
	}
	got := newOutputs()
	describe := func(pos int64) string { return fmt.Sprintf("input line %d", pos) }
	if err := st.Open(mod.Manifest.States); err != nil {
		return nil, err
	}
	ctrl, err := scheduler.New(mod, st, scheduler.SinkFunc(got.write),
		scheduler.WithLookup(lookupFn), scheduler.WithOrder(order),
		scheduler.WithGuestLog(scheduler.WriterLog(opts.Log, describe)), scheduler.WithDescribe(describe),
		scheduler.WithSynchronous(true))
	if err != nil {
		return nil, err
	}

	elems := make(chan []scheduler.Element, 4)
	stop := make(chan struct{})
	feedErr := make(chan error, 1)
	go func() { feedErr <- feed(dir, elems, stop, rep) }()
	runErr := ctrl.Run(ctx, elems)
	close(stop)
	for range elems {
	}
	if err := <-feedErr; err != nil {
		return nil, err
	}
	if runErr != nil {
		var oe *scheduler.OperatorError
		if !errors.As(runErr, &oe) {
			return nil, runErr
		}
		rep.Error = runErr.Error()
	}
	rep.Unrecorded = un.count
	rep.UnrecordedReads, rep.UnrecordedLookups = un.reads, un.lookups
	compare(rep, want, got, opts.MaxDetails)
	return rep, nil
}

func (f *Failure) messageOr(def string) string {
	if f == nil || f.Message == "" {
		return def
	}
	return f.Message
}

// feed sends the recorded elements to the scheduler, in batches, until the end or stop.
func feed(dir string, out chan<- []scheduler.Element, stop <-chan struct{}, rep *Report) error {
	defer close(out)
	batch := make([]scheduler.Element, 0, 256)
	errStop := errors.New("stop")
	send := func() bool {
		if len(batch) == 0 {
			return true
		}
		select {
		case out <- batch:
			batch = make([]scheduler.Element, 0, 256)
			return true
		case <-stop:
			return false
		}
	}
	err := ReadFile(dir, InputFile, func(_ int64, e *Element) error {
		var el scheduler.Element
		if e.Kind == KindWatermark {
			el = scheduler.Element{Kind: scheduler.ElementWatermark, TS: e.TS}
			rep.Watermarks++
		} else {
			el = scheduler.Element{Kind: scheduler.ElementRecord, Key: e.Key, Value: e.Value, TS: e.TS, Pos: e.Pos, KeyByWasm: e.KeyByModule}
			if el.Key == nil {
				el.Key = []byte{}
			}
			if el.Value == nil {
				el.Value = []byte{}
			}
			rep.Records++
		}
		batch = append(batch, el)
		if len(batch) == cap(batch) && !send() {
			return errStop
		}
		return nil
	})
	if errors.Is(err, errStop) {
		return nil
	}
	if err != nil {
		return err
	}
	send()
	return nil
}

// unrecorded collects the reads and lookups a replay asked for that the recording lacks.
type unrecorded struct {
	mu      sync.Mutex
	max     int
	count   int64
	seen    map[string]bool
	reads   []UnrecordedRead
	lookups []UnrecordedLookup
}

func (u *unrecorded) read(id string, r UnrecordedRead) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.seen[id] {
		return
	}
	u.seen[id] = true
	u.count++
	if len(u.reads)+len(u.lookups) < u.max {
		u.reads = append(u.reads, r)
	}
}

func (u *unrecorded) lookup(id string, l UnrecordedLookup) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.seen[id] {
		return
	}
	u.seen[id] = true
	u.count++
	if len(u.reads)+len(u.lookups) < u.max {
		u.lookups = append(u.lookups, l)
	}
}

// stateKey is the map key of (state name, record key, entry).
func stateKey(name string, rec, entry []byte) string {
	b := make([]byte, 0, 2*binary.MaxVarintLen64+len(name)+len(rec)+len(entry))
	b = binary.AppendUvarint(b, uint64(len(name)))
	b = append(b, name...)
	b = binary.AppendUvarint(b, uint64(len(rec)))
	b = append(b, rec...)
	return string(append(b, entry...))
}

type baseValue struct {
	known bool // false: the run wrote the key before it ever read it
	found bool
	value []byte
}

type liveValue struct {
	found bool
	value []byte
}

// replayState is the replay's keyed state: what the replayed module writes, over the values
// the recorded run was served. It is a state.Backend whose every answer is hot.
type replayState struct {
	empty   bool // the recorded run started with no state: what it never saw is absent
	base    map[string]baseValue
	baseOps map[string][]byte
	live    map[string]liveValue
	liveOps map[string][]byte
	names   []string
	un      *unrecorded
}

func loadState(dir string, empty bool, un *unrecorded) (*replayState, error) {
	s := &replayState{empty: empty, base: map[string]baseValue{}, baseOps: map[string][]byte{},
		live: map[string]liveValue{}, liveOps: map[string][]byte{}, un: un}
	err := ReadFile(dir, StateFile, func(_ int64, op *StateOp) error {
		if op.Op == OpOperatorState {
			if _, ok := s.baseOps[op.Name]; !ok {
				s.baseOps[op.Name] = op.Value
			}
			return nil
		}
		k := stateKey(op.State, op.Key, op.Entry)
		if _, ok := s.base[k]; ok {
			return nil // the first line of a key decides
		}
		if op.Op == OpGet {
			s.base[k] = baseValue{known: true, found: op.Found, value: op.Value}
		} else {
			s.base[k] = baseValue{}
		}
		return nil
	})
	return s, err
}

func (s *replayState) Open(names []string) error {
	s.names = append([]string(nil), names...)
	return nil
}

func (s *replayState) name(id state.StateID) string {
	if int(id) < len(s.names) {
		return s.names[id]
	}
	return fmt.Sprintf("#%d", id)
}

func (s *replayState) Get(k state.Key) ([]byte, bool, bool) {
	name := s.name(k.State)
	key := stateKey(name, k.Record, k.Entry)
	if v, ok := s.live[key]; ok {
		return v.value, v.found, true
	}
	if b, ok := s.base[key]; ok && b.known {
		return b.value, b.found, true
	}
	if !s.empty {
		s.un.read("s"+key, UnrecordedRead{State: name, Key: bytes.Clone(k.Record), Entry: bytes.Clone(k.Entry)})
	}
	return nil, false, true
}

func (s *replayState) Put(k state.Key, v []byte) {
	s.live[stateKey(s.name(k.State), k.Record, k.Entry)] = liveValue{found: true, value: bytes.Clone(v)}
}

func (s *replayState) Delete(k state.Key) {
	s.live[stateKey(s.name(k.State), k.Record, k.Entry)] = liveValue{}
}

func (s *replayState) Fetch(keys []state.Key, done func([]state.Fetched, error)) {
	res := make([]state.Fetched, len(keys))
	for i, k := range keys {
		v, found, _ := s.Get(k)
		res[i] = state.Fetched{Key: state.Key{State: k.State, Record: bytes.Clone(k.Record), Entry: bytes.Clone(k.Entry)}, Value: bytes.Clone(v), Found: found}
	}
	done(res, nil)
}

func (s *replayState) Fill([]state.Fetched) {}

func (s *replayState) SetOperatorState(name string, data []byte) {
	s.liveOps[name] = bytes.Clone(data)
}

func (s *replayState) OperatorState(name string) []byte {
	if v, ok := s.liveOps[name]; ok {
		return v
	}
	return s.baseOps[name]
}

func (s *replayState) Capture(uint64) (state.Snapshot, error) { return noSnapshot{}, nil }

func (s *replayState) Close() error { return nil }

type noSnapshot struct{}

func (noSnapshot) Persist(context.Context) error { return nil }
func (noSnapshot) Bytes() int64                  { return 0 }

// replayLookups answers lookups from the recorded responses.
type replayLookups struct {
	mu       sync.Mutex
	byReq    map[string]*responses
	declared []string
	un       *unrecorded
}

type responses struct {
	list []Lookup
	next int
}

// requestKey identifies a request on an endpoint: its canonical form when it parses (so that a
// hand-edited "GET /x" and "GET /x\n\n" are one request), else its raw bytes.
func requestKey(endpoint string, req []byte) string {
	if r, err := lookup.ParseRequest(req); err == nil {
		return stateKey(endpoint, []byte{'p'}, r.AppendTo(nil))
	}
	return stateKey(endpoint, []byte{'r'}, req)
}

func loadLookups(dir string, un *unrecorded) (*replayLookups, error) {
	l := &replayLookups{byReq: map[string]*responses{}, un: un}
	err := ReadFile(dir, LookupFile, func(_ int64, v *Lookup) error {
		k := requestKey(v.Endpoint, v.Request)
		rs := l.byReq[k]
		if rs == nil {
			rs = &responses{}
			l.byReq[k] = rs
		}
		rs.list = append(rs.list, *v)
		return nil
	})
	return l, err
}

// do is the replay's scheduler.LookupFunc. It answers at once, from the recording: the n-th
// identical request gets the n-th recorded response, and the last one once they run out.
func (l *replayLookups) do(_ context.Context, idx uint32, req []byte, done func(int, []byte, error)) {
	if int(idx) >= len(l.declared) {
		done(0, nil, abi.InvalidArgument)
		return
	}
	if _, err := lookup.ParseRequest(req); err != nil {
		done(0, nil, abi.LookupRefused) // the host refuses it before any endpoint sees it
		return
	}
	name := l.declared[idx]
	k := requestKey(name, req)
	l.mu.Lock()
	rs := l.byReq[k]
	var resp Lookup
	if rs != nil {
		resp = rs.list[min(rs.next, len(rs.list)-1)]
		rs.next++
	}
	l.mu.Unlock()
	if rs == nil {
		l.un.lookup("l"+k, UnrecordedLookup{Endpoint: name, Request: bytes.Clone(req)})
		done(0, nil, abi.LookupUnavailable)
		return
	}
	switch {
	case isFatal(resp.Error):
		done(0, nil, errors.New(resp.Error[len("fatal: "):]))
	case resp.Error != "":
		code, _ := codeByName(resp.Error) // checked when read
		done(0, nil, code)
	default:
		done(resp.Status, bytes.Clone(resp.Body), nil)
	}
}

// group is the outputs of one source.
type group struct {
	src  Source
	has  bool // src is set (not clink_open/close)
	outs []OutValue
}

// outputs groups outputs by what produced them: a record by its input position, a timer by
// its time and key, and everything outside a call together.
type outputs struct {
	groups map[string]*group
	n      int64
}

func newOutputs() *outputs { return &outputs{groups: map[string]*group{}} }

func groupKey(src *Source) string {
	switch {
	case src == nil:
		return "o"
	case src.Timer:
		return stateKey("t", binary.BigEndian.AppendUint64(nil, uint64(src.TS)), src.Key)
	}
	return stateKey("r", binary.BigEndian.AppendUint64(nil, uint64(src.Pos)), nil)
}

func (o *outputs) add(src *Source, v OutValue) {
	k := groupKey(src)
	g := o.groups[k]
	if g == nil {
		g = &group{}
		if src != nil {
			g.src, g.has = *src, true
		}
		o.groups[k] = g
	}
	g.outs = append(g.outs, v)
	o.n++
}

func (o *outputs) write(b *scheduler.Batch) error {
	for i := range b.Outputs {
		out := &b.Outputs[i]
		if out.Kind != scheduler.OutputData {
			continue
		}
		var src *Source
		if s := out.Src; s.Key != nil || s.Pos != 0 || s.TS != 0 || s.Timer {
			src = &Source{Pos: s.Pos, Key: Bytes(bytes.Clone(s.Key)), TS: s.TS, Timer: s.Timer}
		}
		o.add(src, OutValue{Key: Bytes(bytes.Clone(out.Key)), Value: Bytes(bytes.Clone(out.Value)), TS: out.TS})
	}
	b.Release()
	return nil
}

func loadOutputs(dir string) (*outputs, error) {
	o := newOutputs()
	err := ReadFile(dir, OutputFile, func(_ int64, v *Output) error {
		o.add(v.Src, OutValue{Key: v.Key, Value: v.Value, TS: v.TS})
		return nil
	})
	return o, err
}

func sameOutputs(a, b []OutValue) bool {
	return slices.EqualFunc(a, b, func(x, y OutValue) bool {
		return bytes.Equal(x.Key, y.Key) && bytes.Equal(x.Value, y.Value) && x.TS == y.TS
	})
}

// compare fills rep's output figures and differences.
func compare(rep *Report, want, got *outputs, maxDetails int) {
	rep.ExpectedOutputs, rep.GotOutputs = want.n, got.n
	keys := make(map[string]bool, len(want.groups))
	for k := range want.groups {
		keys[k] = true
	}
	for k := range got.groups {
		keys[k] = true
	}
	var diffs []Diff
	for k := range keys {
		w, g := want.groups[k], got.groups[k]
		var wo, gout []OutValue
		if w != nil {
			wo = w.outs
		}
		if g != nil {
			gout = g.outs
		}
		ref := w
		if ref == nil {
			ref = g
		}
		if sameOutputs(wo, gout) && (w == nil || g == nil || bytes.Equal(w.src.Key, g.src.Key)) {
			continue
		}
		d := Diff{Expected: wo, Got: gout}
		s := &d.Source
		if !ref.has {
			s.Outside, s.Describe = true, "outside any record (clink_open or clink_close)"
		} else {
			s.Pos, s.Key, s.TS, s.Timer = ref.src.Pos, ref.src.Key, ref.src.TS, ref.src.Timer
			if w != nil && g != nil && !bytes.Equal(w.src.Key, g.src.Key) {
				s.GotKey = g.src.Key
			}
			if s.Timer {
				s.Describe = fmt.Sprintf("timer at %d", s.TS)
			} else {
				s.Describe = fmt.Sprintf("input line %d", s.Pos)
			}
		}
		if d.Expected == nil {
			d.Expected = []OutValue{}
		}
		if d.Got == nil {
			d.Got = []OutValue{}
		}
		diffs = append(diffs, d)
	}
	// Input order: records by position, then timers by time and key, then outside a call.
	rank := func(s DiffSource) int {
		switch {
		case s.Outside:
			return 2
		case s.Timer:
			return 1
		}
		return 0
	}
	slices.SortFunc(diffs, func(a, b Diff) int {
		return cmp.Or(cmp.Compare(rank(a.Source), rank(b.Source)), cmp.Compare(a.Source.Pos, b.Source.Pos),
			cmp.Compare(a.Source.TS, b.Source.TS), bytes.Compare(a.Source.Key, b.Source.Key))
	})
	rep.Differing = int64(len(diffs))
	if len(diffs) > maxDetails {
		diffs = diffs[:maxDetails]
	}
	rep.Diffs = diffs
}
