package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// DefaultMaxBytes is the default size cap of a recording (the sum of its .jsonl files).
const DefaultMaxBytes = 1 << 30

// maxTouched bounds the keys the recorder remembers as already recorded (about 16 bytes each).
// Past it, every read and write is recorded: the recording grows, it stays correct.
const maxTouched = 1 << 20

// ErrSizeCap is the error of a recording that reached its size cap. The run that was being
// recorded fails with it.
var ErrSizeCap = errors.New("recording reached its size cap")

// SizeCapError says which recording reached which cap.
type SizeCapError struct {
	Dir      string
	MaxBytes int64
}

func (e *SizeCapError) Error() string {
	return fmt.Sprintf("recording %s reached its size cap of %d bytes: the run was stopped; raise --record-max-bytes or record a shorter input", e.Dir, e.MaxBytes)
}

func (e *SizeCapError) Is(target error) bool { return target == ErrSizeCap }

// RecorderOptions configures a Recorder.
type RecorderOptions struct {
	// MaxBytes caps the bytes written to the recording's files (default DefaultMaxBytes).
	MaxBytes int64
}

// RunInfo describes the recorded run; the pipeline gives it once the module is loaded.
type RunInfo struct {
	Operator     string
	ModuleSHA256 string
	States       []string // the module's manifest states
	Order        scheduler.Order
	KeyField     string
	TimeField    string
	StateOrigin  string // StateOriginEmpty, "checkpoint N" or "unknown"
	Limits       abi.Limits
	// Declared are the module's endpoints in manifest order; Endpoints the pipeline's
	// definitions (for their secrets, which are never recorded).
	Declared  []string
	Endpoints []lookup.EndpointConfig
}

// Recorder streams what a run sees to a recording directory. Its wrappers are safe for the
// goroutines the pipeline calls them on (the source, the runner, fetch and lookup callbacks).
// Memory is bounded: lines go through buffered files, and the set of keys already recorded is
// capped (maxTouched).
type Recorder struct {
	dir      string
	maxBytes int64
	created  time.Time

	mu struct {
		sync.Mutex
		files    map[string]*os.File
		bufs     map[string]*bufio.Writer
		bytes    int64
		err      error // sticky: the first failure (the cap, or a write error)
		man      Manifest
		secrets  [][]byte
		touched  map[uint64]struct{}
		opStates map[string]bool
		closed   bool
		states   []string // the names the backend was opened with
		enc      bytes.Buffer
	}
	seed maphash.Seed
}

// Create makes a new recording in dir, which must not exist or be empty.
func Create(dir string, opts RecorderOptions) (*Recorder, error) {
	if opts.MaxBytes < 0 {
		return nil, fmt.Errorf("recording size cap must be > 0 (or 0 for the default), not %d", opts.MaxBytes)
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
		return nil, fmt.Errorf("recording directory %s is not empty: choose a new directory (a recording is never overwritten)", dir)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("recording directory: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil { // it holds user data: private
		return nil, fmt.Errorf("recording directory: %w", err)
	}
	r := &Recorder{dir: dir, maxBytes: opts.MaxBytes, created: time.Now().UTC(), seed: maphash.MakeSeed()}
	r.mu.files = map[string]*os.File{}
	r.mu.bufs = map[string]*bufio.Writer{}
	r.mu.touched = map[uint64]struct{}{}
	r.mu.opStates = map[string]bool{}
	r.mu.man = Manifest{Format: Format, Version: Version, Status: StatusRecording, Created: r.created.Format(time.RFC3339),
		Order: "key", StateOrigin: "unknown", MaxBytes: opts.MaxBytes}
	for _, name := range []string{InputFile, StateFile, LookupFile, OutputFile} {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			r.closeFiles()
			return nil, fmt.Errorf("recording: %w", err)
		}
		r.mu.files[name] = f
		r.mu.bufs[name] = bufio.NewWriterSize(f, 64<<10)
	}
	if err := r.writeManifestLocked(); err != nil {
		r.closeFiles()
		return nil, err
	}
	return r, nil
}

// Dir is the recording's directory.
func (r *Recorder) Dir() string { return r.dir }

// Begin records the run's description and learns the secrets it must never write.
func (r *Recorder) Begin(info RunInfo) error {
	secrets, err := injectedSecrets(info.Endpoints)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.secrets = secrets
	m := &r.mu.man
	m.Operator, m.ModuleSHA256 = info.Operator, info.ModuleSHA256
	m.States = append([]string(nil), info.States...)
	m.Order = orderName(info.Order)
	m.KeyField, m.TimeField = info.KeyField, info.TimeField
	if info.StateOrigin != "" {
		m.StateOrigin = info.StateOrigin
	}
	m.Limits = info.Limits
	byName := map[string]lookup.EndpointConfig{}
	for _, c := range info.Endpoints {
		byName[c.Name] = c
	}
	m.Endpoints = nil
	for _, n := range info.Declared {
		m.Endpoints = append(m.Endpoints, Endpoint{Name: n, Base: baseOf(byName[n].BaseURL)})
	}
	return r.writeManifestLocked()
}

func orderName(o scheduler.Order) string {
	switch o {
	case scheduler.OrderInput:
		return "input"
	case scheduler.OrderNone:
		return "none"
	}
	return "key"
}

// baseOf is an endpoint base URL without userinfo, query or fragment.
func baseOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	u.User, u.RawQuery, u.Fragment, u.ForceQuery = nil, "", "", false
	return u.String()
}

// injectedSecrets expands the headers the endpoints inject, as host/lookup does when it opens
// them (lookup.EndpointConfig.Headers: ${env:NAME}, ${file:PATH}, $$), and returns every
// value worth scrubbing: each whole header value and each referenced secret, when at least 4
// bytes long (shorter ones would scrub ordinary data; docs/recording.md says so).
func injectedSecrets(cfgs []lookup.EndpointConfig) ([][]byte, error) {
	var out [][]byte
	add := func(s string) {
		if len(s) >= 4 {
			out = append(out, []byte(s))
		}
	}
	for _, c := range cfgs {
		for name, v := range c.Headers {
			full, refs, err := expand(v)
			if err != nil {
				return nil, fmt.Errorf("endpoint %q: header %s: %w", c.Name, name, err)
			}
			add(full)
			for _, s := range refs {
				add(s)
			}
		}
		if u, err := url.Parse(c.BaseURL); err == nil && u.User != nil {
			if p, ok := u.User.Password(); ok {
				add(p)
			}
		}
	}
	// Longest first, so that a secret containing another is replaced whole.
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if len(out[j]) > len(out[i]) {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out, nil
}

// expand expands ${env:NAME}, ${file:PATH} and $$ in v, returning the result and the values
// of the references.
func expand(v string) (string, []string, error) {
	var b strings.Builder
	var refs []string
	for {
		i := strings.IndexByte(v, '$')
		if i < 0 {
			b.WriteString(v)
			return b.String(), refs, nil
		}
		b.WriteString(v[:i])
		v = v[i:]
		switch {
		case strings.HasPrefix(v, "$$"):
			b.WriteByte('$')
			v = v[2:]
		case strings.HasPrefix(v, "${"):
			end := strings.IndexByte(v, '}')
			if end < 0 {
				return "", nil, errors.New("unterminated ${")
			}
			kind, name, _ := strings.Cut(v[2:end], ":")
			var s string
			switch kind {
			case "env":
				s = os.Getenv(name)
			case "file":
				data, err := os.ReadFile(name)
				if err != nil {
					return "", nil, fmt.Errorf("secret file: %w", err)
				}
				s = strings.TrimRight(string(data), "\r\n")
			default:
				return "", nil, fmt.Errorf("reference ${%s}: want ${env:NAME} or ${file:PATH}", v[2:end])
			}
			refs = append(refs, s)
			b.WriteString(s)
			v = v[end+1:]
		default:
			return "", nil, errors.New(`lone "$"`)
		}
	}
}

// scrub returns b with every secret replaced (b itself when none occurs). Runs under mu.
func (r *Recorder) scrub(b []byte) Bytes {
	if b == nil {
		return nil
	}
	out := b
	for _, s := range r.mu.secrets {
		if n := bytes.Count(out, s); n > 0 {
			r.mu.man.Redacted += int64(n)
			out = bytes.ReplaceAll(out, s, []byte(Redacted))
		}
	}
	return Bytes(out)
}

// write appends one line to file. Runs under mu; the first failure sticks.
func (r *Recorder) write(file string, v any) {
	if r.mu.err != nil || r.mu.closed {
		return
	}
	r.mu.enc.Reset()
	enc := json.NewEncoder(&r.mu.enc)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		r.mu.err = fmt.Errorf("recording: %w", err)
		return
	}
	n := int64(r.mu.enc.Len())
	if r.mu.bytes+n > r.maxBytes {
		r.mu.err = &SizeCapError{Dir: r.dir, MaxBytes: r.maxBytes}
		return
	}
	if _, err := r.mu.bufs[file].Write(r.mu.enc.Bytes()); err != nil {
		r.mu.err = fmt.Errorf("recording %s: %w", r.dir, err)
		return
	}
	r.mu.bytes += n
}

// Err is the recording's first failure, if any (nil while it is healthy).
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.err
}

// Elements records the elements the source hands the scheduler (barriers are not recorded: a
// replay takes no checkpoints). An error means the recording failed and the run must stop.
func (r *Recorder) Elements(els []scheduler.Element) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range els {
		e := &els[i]
		switch e.Kind {
		case scheduler.ElementRecord:
			r.write(InputFile, &Element{Kind: KindRecord, Pos: e.Pos, Key: r.scrub(e.Key), Value: r.scrub(e.Value), TS: e.TS, KeyByModule: e.KeyByWasm})
			r.mu.man.Counts.Records++
		case scheduler.ElementWatermark:
			r.write(InputFile, &Element{Kind: KindWatermark, TS: e.TS})
			r.mu.man.Counts.Watermarks++
		}
	}
	return r.mu.err
}

// Backend wraps the run's state backend.
func (r *Recorder) Backend(b state.Backend) state.Backend { return &recBackend{Backend: b, r: r} }

// Lookup wraps the run's lookup function. declared are the module's endpoint names, by index.
// A nil fn stays nil (the guest then gets LOOKUP_UNAVAILABLE without a call).
func (r *Recorder) Lookup(fn scheduler.LookupFunc, declared []string) scheduler.LookupFunc {
	if fn == nil {
		return nil
	}
	names := append([]string(nil), declared...)
	return func(ctx context.Context, idx uint32, req []byte, done func(int, []byte, error)) {
		if int(idx) >= len(names) {
			fn(ctx, idx, req, done) // refused by the host itself, the same way in a replay
			return
		}
		req = bytes.Clone(req) // the guest's bytes are ours only until we return; done comes later
		fn(ctx, idx, req, func(status int, body []byte, err error) {
			r.mu.Lock()
			l := &Lookup{Endpoint: names[idx], Request: r.scrub(req)}
			var code abi.Code
			switch {
			case errors.As(err, &code):
				l.Error = code.String()
			case err != nil:
				l.Error = "fatal: " + string(r.scrub([]byte(err.Error())))
			default:
				l.Status, l.Body = status, r.scrub(body)
				if l.Body == nil {
					l.Body = Bytes{}
				}
			}
			r.write(LookupFile, l)
			r.mu.man.Counts.Lookups++
			r.mu.Unlock()
			done(status, body, err)
		})
	}
}

// Sink wraps the run's sink: every data output is recorded before it goes on.
func (r *Recorder) Sink(s scheduler.Sink) scheduler.Sink {
	return scheduler.SinkFunc(func(b *scheduler.Batch) error {
		r.mu.Lock()
		for i := range b.Outputs {
			o := &b.Outputs[i]
			if o.Kind != scheduler.OutputData {
				continue
			}
			out := &Output{Key: r.scrub(o.Key), Value: r.scrub(o.Value), TS: o.TS}
			if out.Key == nil {
				out.Key = Bytes{}
			}
			if out.Value == nil {
				out.Value = Bytes{}
			}
			if o.Src.Key != nil || o.Src.Pos != 0 || o.Src.TS != 0 || o.Src.Timer {
				out.Src = &Source{Pos: o.Src.Pos, Key: r.scrub(o.Src.Key), TS: o.Src.TS, Timer: o.Src.Timer}
				if out.Src.Key == nil {
					out.Src.Key = Bytes{}
				}
			}
			r.write(OutputFile, out)
			r.mu.man.Counts.Outputs++
		}
		err := r.mu.err
		r.mu.Unlock()
		if err != nil {
			b.Release()
			return err
		}
		return s.Write(b)
	})
}

// Close flushes the files and writes the final manifest, with how the run ended (runErr, nil
// for a run that finished). It returns the recording's own failure, if any.
func (r *Recorder) Close(runErr error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.closed {
		return r.mu.err
	}
	var flushErr error
	for _, name := range []string{InputFile, StateFile, LookupFile, OutputFile} {
		if err := r.mu.bufs[name].Flush(); err != nil && flushErr == nil {
			flushErr = err
		}
		if err := r.mu.files[name].Sync(); err != nil && flushErr == nil {
			flushErr = err
		}
	}
	r.closeFilesLocked()
	r.mu.closed = true
	if flushErr != nil && r.mu.err == nil {
		r.mu.err = fmt.Errorf("recording %s: %w", r.dir, flushErr)
	}
	m := &r.mu.man
	m.Bytes = r.mu.bytes
	var cap *SizeCapError
	switch {
	case errors.As(r.mu.err, &cap):
		m.Status = StatusTruncated
	case r.mu.err != nil:
		m.Status = StatusFailed
		m.Error = &Failure{Message: string(r.scrub([]byte(r.mu.err.Error())))}
	case runErr != nil:
		m.Status = StatusFailed
		m.Error = &Failure{Message: string(r.scrub([]byte(runErr.Error())))}
		var oe *scheduler.OperatorError
		if errors.As(runErr, &oe) {
			m.Error.Where, m.Error.Key, m.Error.TS = oe.Where, r.scrub(oe.Key), oe.TS
		}
	default:
		m.Status = StatusComplete
	}
	if err := r.writeManifestLocked(); err != nil && r.mu.err == nil {
		r.mu.err = err
	}
	return r.mu.err
}

func (r *Recorder) closeFiles() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closeFilesLocked()
}

func (r *Recorder) closeFilesLocked() {
	for _, f := range r.mu.files {
		f.Close()
	}
}

// writeManifestLocked replaces recording.json atomically.
func (r *Recorder) writeManifestLocked() error {
	b, err := json.MarshalIndent(&r.mu.man, "", "  ")
	if err != nil {
		return fmt.Errorf("recording: %w", err)
	}
	tmp := filepath.Join(r.dir, ManifestFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("recording: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(r.dir, ManifestFile)); err != nil {
		return fmt.Errorf("recording: %w", err)
	}
	return nil
}

// recBackend records the values the backend serves and the first write of each key.
type recBackend struct {
	state.Backend
	r *Recorder
}

func (b *recBackend) Open(names []string) error {
	b.r.mu.Lock()
	b.r.mu.states = append([]string(nil), names...)
	b.r.mu.Unlock()
	return b.Backend.Open(names)
}

func (b *recBackend) stateName(id state.StateID) string {
	if int(id) < len(b.r.mu.states) {
		return b.r.mu.states[id]
	}
	return fmt.Sprintf("#%d", id)
}

// seen reports whether k was already recorded, and remembers it (while the set has room).
// Runs under mu.
func (b *recBackend) seen(k state.Key) bool {
	var h maphash.Hash
	h.SetSeed(b.r.seed)
	var hdr [10]byte
	hdr[0], hdr[1] = byte(k.State), byte(k.State>>8)
	n := len(k.Record)
	for i := range 8 {
		hdr[2+i] = byte(n >> (8 * i))
	}
	h.Write(hdr[:])
	h.Write(k.Record)
	h.Write(k.Entry)
	sum := h.Sum64()
	if _, ok := b.r.mu.touched[sum]; ok {
		return true
	}
	if len(b.r.mu.touched) < maxTouched {
		b.r.mu.touched[sum] = struct{}{}
	}
	return false
}

// served records a value the run was given, unless its key was recorded before: then it is
// either the same base value or one the run wrote itself, which a replay reproduces.
func (b *recBackend) served(k state.Key, v []byte, found bool, tier string) {
	if b.seen(k) {
		return
	}
	op := &StateOp{Op: OpGet, State: b.stateName(k.State), Key: b.r.scrub(k.Record), Entry: b.r.scrub(k.Entry), Found: found, Tier: tier}
	if op.Key == nil {
		op.Key = Bytes{}
	}
	if found {
		op.Value = b.r.scrub(v)
		if op.Value == nil {
			op.Value = Bytes{}
		}
	}
	b.r.write(StateFile, op)
	b.r.mu.man.Counts.StateReads++
}

func (b *recBackend) Get(k state.Key) ([]byte, bool, bool) {
	v, found, hot := b.Backend.Get(k)
	if hot {
		b.r.mu.Lock()
		b.served(k, v, found, "hot")
		b.r.mu.Unlock()
	}
	return v, found, hot
}

func (b *recBackend) written(k state.Key, op string) {
	b.r.mu.Lock()
	if !b.seen(k) {
		rec := &StateOp{Op: op, State: b.stateName(k.State), Key: b.r.scrub(k.Record), Entry: b.r.scrub(k.Entry)}
		if rec.Key == nil {
			rec.Key = Bytes{}
		}
		b.r.write(StateFile, rec)
		b.r.mu.man.Counts.Writes++
	}
	b.r.mu.Unlock()
}

func (b *recBackend) Put(k state.Key, v []byte) {
	b.written(k, OpPut)
	b.Backend.Put(k, v)
}

func (b *recBackend) Delete(k state.Key) {
	b.written(k, OpDelete)
	b.Backend.Delete(k)
}

func (b *recBackend) Fetch(keys []state.Key, done func([]state.Fetched, error)) {
	b.Backend.Fetch(keys, func(res []state.Fetched, err error) {
		if err == nil {
			b.r.mu.Lock()
			for i := range res {
				b.served(res[i].Key, res[i].Value, res[i].Found, "cold")
			}
			b.r.mu.Unlock()
		}
		done(res, err)
	})
}

func (b *recBackend) OperatorState(name string) []byte {
	v := b.Backend.OperatorState(name)
	b.r.mu.Lock()
	if !b.r.mu.opStates[name] {
		b.r.mu.opStates[name] = true
		b.r.write(StateFile, &StateOp{Op: OpOperatorState, Name: name, Found: v != nil, Value: b.r.scrub(v)})
	}
	b.r.mu.Unlock()
	return v
}

func (b *recBackend) SetOperatorState(name string, data []byte) {
	b.r.mu.Lock()
	b.r.mu.opStates[name] = true // from now on the run's own blob, not a base value
	b.r.mu.Unlock()
	b.Backend.SetOperatorState(name, data)
}
