// Package ingest has the connectors of hosted pipelines: the HTTP ingest source, whose records
// are appended to a durable log before the API answers, and the preview sink, whose committed
// output the API tails.
//
// # The ingest log
//
// A Log is one append-only file. An append is one batch: a header line
//
//	#b <idempotency-key or -> <body bytes> <records>\n
//
// followed by the batch's JSON Lines. The batch is written with one write and made durable
// before Append returns, so a 2xx answered after Append survives a SIGKILL. Readers see only
// what is durable (the durable length). A record's position is the byte offset of its line, so
// a checkpoint's source position (the offset after the last record read) covers exactly the
// records before it.
//
// # Preallocation
//
// The file is kept zero-filled, written and fsynced, up to PreallocBytes beyond its durable
// length (the allocated length). A batch that lands inside it needs only fdatasync: the blocks
// and the file's size are already durable, so the filesystem flushes the batch's pages without
// a journal commit. An append that grows the file needs fsync, which on ext4 waits for the
// journal thread to commit the inode, and with it everything else the filesystem has pending:
// on a 2-vCPU host that is a kernel thread which has to find a CPU (one core busy with another
// tenant's guest) and a commit that carries other tenants' checkpoint writes. fdatasync over
// written zeros measured half of fsync on append here (170 against 340 µs) and kept its p99
// with a core busy. (fallocate is not enough: its unwritten extents are converted, in the
// journal, on the first write.) When the allocated space runs low, a background goroutine
// writes and fsyncs the next PreallocBytes of zeros; an append that outruns it waits for it,
// and one larger than what is allocated is written and fsynced as before.
//
// Recovery: the log's end is where the batches stop, not the file's size. A valid log holds no
// NUL byte (headers are printable, records compact JSON), so a NUL where a header or a
// batch's body should be marks the end: the allocated zeros, or a torn batch (a crash during
// a write that was never acknowledged: whichever of its pages did not reach the disk read as
// zeros). On open everything from the end on is zeroed again, including a torn batch's pages
// that did reach the disk, so the invariant holds: past the durable length there are only
// zeros, and a later torn write cannot expose an older one's bytes.
//
// The idempotency keys of the newest MaxKeys batches are kept in memory (rebuilt from the
// headers on open): a retried batch with a known key is answered as the first was, without
// appending.
//
// Release: once a checkpoint covering a position is committed, Release frees the disk blocks of
// the whole batches before it (a hole punched in place, so offsets do not change) and records
// the new start of the log durably in PATH.start; recovery and readers begin there. Keys of
// released batches are kept in memory but not across a restart.
//
// Backpressure: the log refuses an append (ErrBackpressure) when the bytes not yet read by the
// pipeline (the durable length minus the reader's position) would exceed MaxLagBytes, so the
// log never grows without bound ahead of a slow or stopped pipeline.
package ingest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/clink-wasm/clink-wasm/internal/jsonfield"
)

// Defaults of a Log.
const (
	DefaultMaxLagBytes = 64 << 20
	DefaultMaxKeys     = 10000
	maxKeyLen          = 128
	// PreallocBytes is how far ahead of its durable length the log keeps zeros written
	// (Preallocation above).
	PreallocBytes = 1 << 20
)

// ErrBackpressure refuses an append while the pipeline lags: retry later.
var ErrBackpressure = errors.New("ingest: the pipeline is behind; retry later")

// ErrClosed refuses an append to a closed log.
var ErrClosed = errors.New("ingest: log closed")

// BadRecordError names the line of a batch that is not a JSON object.
type BadRecordError struct {
	Line   int
	Reason string
}

func (e *BadRecordError) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Reason) }

// Result describes an accepted batch.
type Result struct {
	Records   int   `json:"records"`
	Offset    int64 `json:"offset"` // where the batch starts in the log
	End       int64 `json:"end"`    // the durable length after it
	Duplicate bool  `json:"duplicate,omitempty"`
}

// Log is one pipeline's ingest log. It is safe for concurrent use.
type Log struct {
	path    string
	maxLag  int64
	maxKeys int
	mu      sync.Mutex
	f       *os.File
	durable int64
	start   int64   // the first batch kept (everything before it is released)
	batches []int64 // offsets of the batch headers at or after start
	read    int64   // the newest reader position reported (Consumed)
	keys    map[string]Result
	order   []string
	notify  chan struct{} // closed and replaced on every append
	closed  bool
	// alloc is the allocated length: [durable, alloc) is zeros, written and fsynced with the
	// file's size, so an append ending at or before it needs only fdatasync.
	alloc int64
	// ext, while an extension of the allocated space runs (extend), receives its new
	// allocated length (or the length before it, on failure). INVARIANT: while it runs, no
	// append writes at or beyond alloc.
	ext chan int64
}

// Options configure Open.
type Options struct {
	MaxLagBytes int64
	MaxKeys     int
}

// Open opens (or creates) the log at path, truncating a torn tail.
func Open(path string, o Options) (*Log, error) {
	if o.MaxLagBytes <= 0 {
		o.MaxLagBytes = DefaultMaxLagBytes
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = DefaultMaxKeys
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("ingest: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("ingest: %w", err)
	}
	l := &Log{path: path, f: f, maxLag: o.MaxLagBytes, maxKeys: o.MaxKeys, keys: map[string]Result{}, notify: make(chan struct{})}
	if err := l.recover(); err != nil {
		f.Close()
		return nil, err
	}
	return l, nil
}

type header struct {
	key     string
	body    int64
	records int
}

func parseHeader(line []byte) (header, bool) {
	f := strings.Fields(string(line))
	if len(f) != 4 || f[0] != "#b" {
		return header{}, false
	}
	n, err1 := strconv.ParseInt(f[2], 10, 64)
	r, err2 := strconv.Atoi(f[3])
	if err1 != nil || err2 != nil || n < 0 || r < 0 {
		return header{}, false
	}
	k := f[1]
	if k == "-" {
		k = ""
	}
	return header{key: k, body: n, records: r}, true
}

// recover scans the batches from the recorded start, rebuilds the key index and truncates an
// incomplete last batch.
func (l *Log) recover() error {
	st, err := l.f.Stat()
	if err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	size := st.Size()
	if b, err := os.ReadFile(l.path + ".start"); err == nil {
		if l.start, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil || l.start < 0 || l.start > size {
			return fmt.Errorf("ingest: %s.start is corrupt (%q)", l.path, b)
		}
	} else if !os.IsNotExist(err) {
		return fmt.Errorf("ingest: %w", err)
	}
	r := bufio.NewReaderSize(io.NewSectionReader(l.f, l.start, size-l.start), 64<<10)
	off := l.start
	var body []byte
	for off < size {
		if b, err := r.Peek(1); err != nil || b[0] == 0 {
			break // the allocated zeros, or a torn batch whose first page is missing
		}
		line, err := r.ReadSlice('\n')
		if err != nil || bytes.IndexByte(line, 0) >= 0 {
			break // a torn header
		}
		h, ok := parseHeader(bytes.TrimSuffix(line, []byte("\n")))
		if !ok {
			return fmt.Errorf("ingest: %s is corrupt at offset %d (not a batch header)", l.path, off)
		}
		end := off + int64(len(line)) + h.body
		if end > size {
			break // a torn body
		}
		if int64(cap(body)) < h.body {
			body = make([]byte, h.body)
		}
		body = body[:h.body]
		if _, err := io.ReadFull(r, body); err != nil {
			break
		}
		if bytes.IndexByte(body, 0) >= 0 || (h.body > 0 && body[h.body-1] != '\n') {
			break // a torn body: some of its pages did not reach the disk
		}
		l.remember(h.key, Result{Records: h.records, Offset: off, End: end, Duplicate: true})
		l.batches = append(l.batches, off)
		off = end
	}
	if err := l.zeroTail(off, size); err != nil {
		return err
	}
	// Durable with the file's size (an extension may have been cut short by the crash).
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	l.durable = off
	l.alloc = size
	l.read = l.start
	return nil
}

// zeroTail writes zeros over whatever is not zero in [off, size): a torn batch's pages.
func (l *Log) zeroTail(off, size int64) error {
	last := int64(-1) // the last non-zero byte
	buf := make([]byte, 64<<10)
	for at := off; at < size; at += int64(len(buf)) {
		n, err := l.f.ReadAt(buf[:min(int64(len(buf)), size-at)], at)
		if err != nil && err != io.EOF {
			return fmt.Errorf("ingest: reading the tail: %w", err)
		}
		for i := n - 1; i >= 0; i-- {
			if buf[i] != 0 {
				last = at + int64(i)
				break
			}
		}
	}
	if last < off {
		return nil
	}
	clear(buf)
	for at := off; at <= last; at += int64(len(buf)) {
		if _, err := l.f.WriteAt(buf[:min(int64(len(buf)), last+1-at)], at); err != nil {
			return fmt.Errorf("ingest: zeroing a torn tail: %w", err)
		}
	}
	return nil
}

// extend starts writing the next PreallocBytes of zeros after alloc, in the background, unless
// an extension runs already. Called with mu held.
func (l *Log) extend() {
	if l.ext != nil {
		return
	}
	from := l.alloc
	l.ext = make(chan int64, 1)
	go func(done chan<- int64) {
		zeros := make([]byte, 64<<10)
		to := from + PreallocBytes
		for at := from; at < to; at += int64(len(zeros)) {
			if _, err := l.f.WriteAt(zeros, at); err != nil {
				done <- from
				return
			}
		}
		if err := l.f.Sync(); err != nil {
			done <- from
			return
		}
		done <- to
	}(l.ext)
}

// harvest takes the result of the extension in flight, waiting for it if wait is set. Called
// with mu held.
func (l *Log) harvest(wait bool) {
	if l.ext == nil {
		return
	}
	if wait {
		l.alloc = max(l.alloc, <-l.ext)
		l.ext = nil
		return
	}
	select {
	case a := <-l.ext:
		l.alloc = max(l.alloc, a)
		l.ext = nil
	default:
	}
}

// Release frees the batches wholly before pos (a position a committed checkpoint covers): the
// batch pos falls in, and every later one, are kept.
func (l *Log) Release(pos int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	// The last batch header at or before pos.
	i := sort.Search(len(l.batches), func(i int) bool { return l.batches[i] > pos }) - 1
	if i <= 0 || l.batches[i] <= l.start {
		return nil
	}
	newStart := l.batches[i]
	tmp := l.path + ".start.tmp"
	if err := writeSynced(tmp, []byte(strconv.FormatInt(newStart, 10)+"\n")); err != nil {
		return fmt.Errorf("ingest: recording the log's start: %w", err)
	}
	if err := os.Rename(tmp, l.path+".start"); err != nil {
		return fmt.Errorf("ingest: recording the log's start: %w", err)
	}
	if d, err := os.Open(filepath.Dir(l.path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	// Blocks wholly before the new start are freed; the file keeps its size and offsets.
	const block = 4096
	from, to := l.start/block*block, newStart/block*block
	l.start = newStart
	l.batches = append(l.batches[:0], l.batches[i:]...)
	if to > from {
		if err := punchHole(l.f, from, to-from); err != nil {
			return fmt.Errorf("ingest: freeing released records: %w", err)
		}
	}
	return nil
}

// Start is the offset of the first batch kept.
func (l *Log) Start() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.start
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (l *Log) remember(key string, r Result) {
	if key == "" {
		return
	}
	if _, ok := l.keys[key]; !ok {
		l.order = append(l.order, key)
	}
	l.keys[key] = r
	for len(l.order) > l.maxKeys {
		delete(l.keys, l.order[0])
		l.order = l.order[1:]
	}
}

// ValidKey reports whether k can be an idempotency key: 1-128 printable ASCII characters
// without spaces.
func ValidKey(k string) bool {
	if k == "" || len(k) > maxKeyLen {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= ' ' || k[i] > '~' {
			return false
		}
	}
	return true
}

// Frame checks body (JSON Lines: one JSON object a line, blank lines ignored) and returns the
// records normalised to one line each, and their count.
func Frame(body []byte) ([]byte, int, error) {
	var out bytes.Buffer
	out.Grow(len(body) + 1)
	n := 0
	for i, line := range bytes.Split(body, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if line[0] != '{' || !jsonfield.Valid(line) {
			return nil, 0, &BadRecordError{Line: i + 1, Reason: "not a JSON object"}
		}
		if err := json.Compact(&out, line); err != nil {
			return nil, 0, &BadRecordError{Line: i + 1, Reason: err.Error()}
		}
		out.WriteByte('\n')
		n++
	}
	return out.Bytes(), n, nil
}

// Append makes body's records durable (see Frame for the format) and returns once they are
// fsynced. A key seen before returns the first result with Duplicate set and appends nothing.
func (l *Log) Append(key string, body []byte) (Result, error) {
	if key != "" && !ValidKey(key) {
		return Result{}, fmt.Errorf("ingest: bad idempotency key %q", key)
	}
	framed, n, err := Frame(body)
	if err != nil {
		return Result{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return Result{}, ErrClosed
	}
	if r, ok := l.keys[key]; ok && key != "" {
		r.Duplicate = true
		return r, nil
	}
	if n == 0 {
		return Result{Offset: l.durable, End: l.durable}, nil
	}
	k := key
	if k == "" {
		k = "-"
	}
	hdr := fmt.Sprintf("#b %s %d %d\n", k, len(framed), n)
	if lag := l.durable - l.read; lag > 0 && lag+int64(len(hdr)+len(framed)) > l.maxLag {
		return Result{}, ErrBackpressure
	}
	buf := make([]byte, 0, len(hdr)+len(framed))
	buf = append(append(buf, hdr...), framed...)
	end := l.durable + int64(len(buf))
	l.harvest(end > l.alloc) // a batch beyond the allocated space waits for the extension
	inside := end <= l.alloc
	if _, err := l.f.WriteAt(buf, l.durable); err != nil {
		l.undo()
		return Result{}, fmt.Errorf("ingest: writing the log: %w", err)
	}
	if inside {
		err = fdatasync(l.f)
	} else {
		err = l.f.Sync() // the file grew: its size must be durable too
	}
	if err != nil {
		// The bytes may or may not be durable: refuse the batch, and drop what was written so
		// that a retry does not find it twice.
		l.undo()
		return Result{}, fmt.Errorf("ingest: fsync: %w", err)
	}
	res := Result{Records: n, Offset: l.durable, End: end}
	l.batches = append(l.batches, l.durable)
	l.durable = res.End
	l.alloc = max(l.alloc, l.durable)
	if l.alloc-l.durable < PreallocBytes/2 {
		l.extend()
	}
	l.remember(key, res)
	close(l.notify)
	l.notify = make(chan struct{})
	return res, nil
}

// undo drops what a failed append wrote after the durable length, and the allocated space with
// it (nothing past the durable length is trusted to be zeros any more). Called with mu held.
func (l *Log) undo() {
	l.harvest(true)
	_ = l.f.Truncate(l.durable)
	l.alloc = l.durable
}

// Durable is the log's fsynced length.
func (l *Log) Durable() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.durable
}

// Lag is how many bytes the pipeline has not read yet.
func (l *Log) Lag() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(0, l.durable-l.read)
}

// consumed records the reader's position (called by the source reader).
func (l *Log) consumed(pos int64) {
	l.mu.Lock()
	l.read = pos
	l.mu.Unlock()
}

func (l *Log) snapshot() (int64, <-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.durable, l.notify, l.closed
}

// Close closes the log; readers see no more records.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.notify)
	l.harvest(true)
	return l.f.Close()
}

// Reader reads the records of the log from a position. It is used by one goroutine.
type Reader struct {
	log   *Log
	f     *os.File
	pos   int64 // the offset of the next batch header or record line
	left  int   // records left in the current batch
	r     *bufio.Reader
	rpos  int64 // the file offset r reads at
	end   int64 // the durable length r's section ends at
	wait  time.Duration
	arena []byte
}

// NewReader reads l from pos (0, or an offset a Reader reported).
func (l *Log) NewReader(pos int64, left int) (*Reader, error) {
	if pos < 0 || left < 0 || pos > l.Durable() {
		return nil, fmt.Errorf("ingest: position %d is beyond the log (%d bytes)", pos, l.Durable())
	}
	if pos == 0 && left == 0 {
		pos = l.Start() // the beginning of what is kept
	} else if pos < l.Start() {
		return nil, fmt.Errorf("ingest: position %d was released (the log starts at %d)", pos, l.Start())
	}
	f, err := os.Open(l.path)
	if err != nil {
		return nil, fmt.Errorf("ingest: %w", err)
	}
	rd := &Reader{log: l, f: f, pos: pos, left: left, wait: 20 * time.Millisecond}
	l.consumed(pos)
	return rd, nil
}

// Record is one record read from the log.
type Record struct {
	Value []byte // valid until the next Next
	Pos   int64  // the offset of its line
}

// Next fills recs with up to len(recs) records; it waits briefly (20ms) when there is none and
// returns 0 then. The values are valid until the next call.
func (r *Reader) Next(ctx context.Context, recs []Record) (int, error) {
	durable, notify, closed := r.log.snapshot()
	if r.pos >= durable {
		if closed {
			return 0, ErrClosed
		}
		t := time.NewTimer(r.wait)
		defer t.Stop()
		select {
		case <-notify:
		case <-t.C:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		durable, _, _ = r.log.snapshot()
		if r.pos >= durable {
			return 0, nil
		}
	}
	if r.r == nil || r.rpos != r.pos || r.end != durable {
		r.r = bufio.NewReaderSize(io.NewSectionReader(r.f, r.pos, durable-r.pos), 64<<10)
		r.rpos, r.end = r.pos, durable
	}
	r.arena = r.arena[:0]
	var spans [][2]int
	var poss []int64
	for len(spans) < len(recs) && r.pos < durable {
		line, err := r.r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			long := append([]byte(nil), line...)
			rest, rerr := r.r.ReadBytes('\n')
			line, err = append(long, rest...), rerr
		}
		if err != nil {
			r.r = nil
			return 0, fmt.Errorf("ingest: reading %s at %d: %w", r.log.path, r.pos, err)
		}
		at := r.pos
		r.pos += int64(len(line))
		r.rpos = r.pos
		if r.left == 0 {
			h, ok := parseHeader(bytes.TrimSuffix(line, []byte("\n")))
			if !ok {
				return 0, fmt.Errorf("ingest: %s is corrupt at offset %d", r.log.path, at)
			}
			r.left = h.records
			continue
		}
		r.left--
		s := len(r.arena)
		r.arena = append(r.arena, line[:len(line)-1]...)
		spans = append(spans, [2]int{s, len(r.arena)})
		poss = append(poss, at)
	}
	for i, sp := range spans {
		recs[i] = Record{Value: r.arena[sp[0]:sp[1]:sp[1]], Pos: poss[i]}
	}
	r.log.consumed(r.pos)
	return len(spans), nil
}

// Pos is the reader's position: the offset after the last record returned, and how many
// records of the current batch follow it (a reader resumes there with NewReader(pos, left)).
func (r *Reader) Pos() (int64, int) { return r.pos, r.left }

// Close releases the reader.
func (r *Reader) Close() error { return r.f.Close() }
