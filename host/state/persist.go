package state

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/host/state/internal/format"
)

// snapshot is a captured delta of one Tiered backend.
type snapshot struct {
	b         *Tiered
	id        uint64
	seq       uint64 // capture sequence within the backend
	savepoint bool
	spill     bool // a spilled delta (Tiered.spill): written, not committed
	names     []string
	// ents are the entries of the delta's generation (seq), read by the persist through
	// their cells (see entry). The runner drops the slice once it has observed the outcome.
	ents []*entry
	// list is the sentinel of the runner's list of the generation's entries not written since
	// (runner-owned): observe moves them to the LRU list, or makes them dirty again.
	list        entry
	pinnedBytes int64 // their sizes, counted in Tiered.run.pinnedOut while pending
	opState     []format.NamedBlob
	estimate    int64
	bytes       atomic.Int64

	prev *snapshot // guarded by b.mu; cleared once done
	once sync.Once
	// encoded is closed once the persist no longer reads the delta's cells (copied out, or
	// failed). Persists read their cells one at a time in capture order (see entry). Only the
	// persist's write (run) closes it.
	encoded chan struct{}
	// readable is closed once the delta's segments are encoded and in the version cold reads
	// use, from memory until they are durable (see publish): from then on the delta's entries
	// need not stay hot. memBytes, set before, is what those segments hold in memory. Only
	// the persist's goroutine closes it; a delta that fails before it never is.
	readable chan struct{}
	memBytes int64
	// carriedBytes is the size of the carried segments this delta's persist took (see
	// Tiered.mu.carried), set before done.
	carriedBytes int64
	// readSeen: the runner has applied readable (runner-owned).
	readSeen bool
	done     chan struct{}
	err      error // set before done is closed
}

// isReadable reports whether readable is closed.
func (s *snapshot) isReadable() bool {
	select {
	case <-s.readable:
		return true
	default:
		return false
	}
}

// markEncoded closes encoded, once.
func (s *snapshot) markEncoded() {
	select {
	case <-s.encoded:
	default:
		close(s.encoded)
	}
}

func (s *snapshot) finished() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Bytes implements Snapshot: the delta's size (an estimate until Persist has encoded it).
func (s *snapshot) Bytes() int64 { return s.bytes.Load() }

// Persist implements Snapshot. Snapshots of a backend commit in capture order: Persist starts
// any earlier snapshot that nobody has started yet, and fails with ErrPreviousFailed if an
// earlier one failed. Their segments are written in parallel (the slow part on a remote pool);
// only the commits, which publish what each wrote, are serialised, in capture order. It is safe
// to call from any goroutine, and more than once.
func (s *snapshot) Persist(ctx context.Context) error {
	s.startChain(ctx)
	select {
	case <-s.done:
		return s.err
	case <-ctx.Done():
		// The persist goes on under the context of whoever started it; this caller stops
		// waiting for it.
		select {
		case <-s.done:
			return s.err
		default:
			return ctx.Err()
		}
	}
}

// startChain starts the persists of s and of every earlier snapshot not started yet, oldest
// first. A persist must not wait for an earlier one that nobody starts.
func (s *snapshot) startChain(ctx context.Context) {
	b := s.b
	b.mu.Lock()
	var chain []*snapshot
	for p := s; p != nil; p = p.prev {
		chain = append(chain, p)
	}
	b.mu.Unlock()
	for i := len(chain) - 1; i >= 0; i-- {
		chain[i].start(ctx)
	}
}

// start runs the snapshot's persist on its own goroutine, once.
func (s *snapshot) start(ctx context.Context) {
	s.once.Do(func() {
		b := s.b
		b.mu.Lock()
		closed := b.mu.closed
		if !closed {
			b.persists.Add(1) // under mu: Close marks closed, then waits
		}
		b.mu.Unlock()
		if closed {
			s.run(ctx) // fails at once with ErrClosed
			return
		}
		go func() {
			defer b.persists.Done()
			s.run(ctx)
		}()
	})
}

func (s *snapshot) run(ctx context.Context) {
	b := s.b
	b.mu.Lock()
	prev := s.prev
	b.mu.Unlock()
	// 1. Read the delta once the one before it has (see entry), then write its segments, in
	// parallel with the snapshots before it.
	if prev != nil {
		<-prev.encoded
	}
	var (
		w    written
		werr error
	)
	wrote := make(chan struct{})
	write := func() {
		defer close(wrote)
		w, werr = b.write(ctx, s)
		s.markEncoded() // write may have failed before reading
	}
	// A checkpoint's fence on the lineage head goes beside its segments' PUTs (see fence).
	early := !s.spill && !s.savepoint
	if early {
		go write()
	} else {
		write()
	}
	// 2. Commit in capture order.
	var err error
	if prev != nil {
		<-prev.done
		if prev.err != nil {
			err = fmt.Errorf("checkpoint %d: %w (checkpoint %d: %v)", s.id, ErrPreviousFailed, prev.id, prev.err)
		}
	}
	fenced := false
	if early && err == nil {
		err = b.fence(ctx, s)
		fenced = err == nil
	}
	<-wrote
	if err == nil {
		err = werr
	}
	if err == nil {
		err = b.commit(ctx, s, w, fenced)
	}
	if err != nil {
		b.cnt.ckptFailures.Add(1)
		b.carry(w)
	}
	s.carriedBytes = w.carriedBytes
	s.err = err
	b.mu.Lock()
	s.prev = nil
	b.mu.Unlock()
	close(s.done)
	b.events.Add(1)
}

// written is what the write phase of a persist made: the delta's segments, not yet referenced
// by any version or manifest (a crash leaves them to garbage collection).
type written struct {
	segs         []format.SegRef
	bytes        int64
	start        time.Time
	own          []string // names of the delta's own segments
	took         []memSeg // carried segments this persist writes again, newest first
	carriedBytes int64
}

// memSeg is an encoded segment held in memory, readable, until it is durable and committed
// (see Tiered.mu.mem).
type memSeg struct {
	ref  format.SegRef
	seq  uint64 // the capture seq of the delta it came from
	data []byte
	// carried: the delta's persist failed after the segment was readable. Its entries may
	// have left the hot tier, so its bytes stay here until the next delta to persist takes
	// it, writes it again and commits it below its own.
	carried bool
}

// persistContext derives the context of one persist step: Close cancels a persist in flight.
// done releases it.
func (b *Tiered) persistContext(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(b.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// write encodes the delta in durable-key order and writes it as segments.
func (b *Tiered) write(ctx context.Context, s *snapshot) (written, error) {
	w := written{start: time.Now()}
	ctx, done := b.persistContext(ctx)
	defer done()
	b.mu.Lock()
	closed, baseCkpt := b.mu.closed, b.mu.base.Checkpoint
	b.mu.Unlock()
	if closed {
		return w, ErrClosed
	}
	// This is CPU that competes with the runner (two cores, checkpoints every 100 ms): the
	// delta is copied into one arena (durable key, then value) indexed by pointer-free
	// records, so that the GC neither scans them nor pays write barriers to sort them, and the
	// sort is a counting pass by key group plus generic sorts of 4-byte indexes.
	d := b.encodeDelta(s)
	// The carried segments go with the first delta to read its cells after they were carried:
	// deltas do that in capture order, and a delta commits only if every one before it did
	// or had finished when it was captured, so the first to commit after a failure is one
	// that took every segment carried since the last commit.
	b.mu.Lock()
	for i := range b.mu.mem {
		if m := &b.mu.mem[i]; m.carried {
			m.carried = false
			w.took = append(w.took, *m)
			w.carriedBytes += int64(len(m.data))
		}
	}
	b.mu.Unlock()
	s.markEncoded()
	tag := fmt.Sprintf("%020d", s.id)
	if s.spill {
		tag = fmt.Sprintf("%020d-spill%d", baseCkpt, s.seq)
	}
	order := sortDurable(len(d.recs), d.key)
	outs := b.encodeSegments(tag, len(order), func(i int) format.SegEntry { return d.at(int(order[i])) }, false, len(d.arena))
	d = nil // the segments copied what they need: let the GC have the arena while the PUTs run
	b.publish(s, outs)
	for _, o := range outs {
		w.own = append(w.own, o.ref.Name)
	}
	for _, m := range w.took {
		outs = append(outs, segOut{data: m.data, ref: m.ref})
	}
	var err error
	w.segs, w.bytes, err = b.putSegments(ctx, outs)
	return w, err
}

// publish makes a delta's encoded segments readable from memory, in a version above every
// committed segment, then tells the runner (readable), which may then evict the delta's
// entries: the version INVARIANT holds for them as for a commit's.
func (b *Tiered) publish(s *snapshot, outs []segOut) {
	for _, o := range outs {
		s.memBytes += int64(len(o.data))
		b.wrote(o.ref.Name, o.data, o.ref.SegInfo)
	}
	b.mu.Lock()
	for _, o := range outs {
		b.mu.mem = append(b.mu.mem, memSeg{ref: o.ref, seq: s.seq, data: o.data})
		b.addToGenLocked(o.ref.Name, o.hashes)
	}
	sortMem(b.mu.mem)
	b.setVersionLocked(b.buildVersionLocked(b.mu.base))
	b.mu.Unlock()
	close(s.readable)
	b.events.Add(1)
}

// sortMem orders in-memory segments newest first (by delta; a delta's own in their order).
func sortMem(ms []memSeg) {
	slices.SortStableFunc(ms, func(x, y memSeg) int { return cmp.Compare(y.seq, x.seq) })
}

// carry keeps what a failed persist leaves in memory readable until another delta writes it:
// its own segments, if it published them, and the carried segments it took. Once the runner
// has seen a delta readable it no longer holds the delta's entries, so that is where they are.
func (b *Tiered) carry(w written) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.mu.mem {
		m := &b.mu.mem[i]
		if slices.Contains(w.own, m.ref.Name) || slices.ContainsFunc(w.took, func(t memSeg) bool { return t.ref.Name == m.ref.Name }) {
			m.carried = true
		}
	}
}

// dropMemLocked forgets the in-memory copies of segments a commit made durable.
func (b *Tiered) dropMemLocked(w written) {
	b.mu.mem = slices.DeleteFunc(b.mu.mem, func(m memSeg) bool {
		return slices.Contains(w.own, m.ref.Name) || slices.ContainsFunc(w.took, func(t memSeg) bool { return t.ref.Name == m.ref.Name })
	})
}

// delta is a captured delta copied out of the hot tier: records in an arena.
type delta struct {
	arena []byte
	recs  []deltaRec
}

// deltaRec locates one entry in delta.arena: its durable key at off, then its value.
type deltaRec struct {
	off        int
	klen, vlen uint32
	tomb       bool
}

func (d *delta) key(i int) []byte {
	r := d.recs[i]
	return d.arena[r.off : r.off+int(r.klen) : r.off+int(r.klen)]
}

func (d *delta) at(i int) format.SegEntry {
	r := d.recs[i]
	k := r.off + int(r.klen)
	return format.SegEntry{Key: d.arena[r.off:k:k], Value: d.arena[k : k+int(r.vlen) : k+int(r.vlen)], Tomb: r.tomb}
}

// encodeDelta reads the value of s's generation of each of its entries (see entry) into a
// delta. It runs once every earlier snapshot's persist has encoded, so it cuts each cell it
// reads off the cells below, which nothing reads any more.
func (b *Tiered) encodeDelta(s *snapshot) *delta {
	// One pass over the entries, which are spread over the heap (each one a cache miss or
	// two): the arena starts at a guess of 32 bytes an entry and grows by append.
	d := &delta{arena: make([]byte, 0, 32*len(s.ents)), recs: make([]deltaRec, len(s.ents))}
	for i, e := range s.ents {
		c := e.c.Load()
		for c != nil && c.gen > s.seq {
			c = c.prev.Load()
		}
		if c == nil || c.gen != s.seq {
			panic(fmt.Sprintf("state: entry %q has no cell of generation %d", e.key, s.seq))
		}
		if c.prev.Load() != nil {
			c.prev.Store(nil)
		}
		id, rec, ent := parseHotKey(e.key)
		var name string
		if int(id) < len(s.names) {
			name = s.names[id]
		} else {
			name = "#" + strconv.FormatUint(uint64(id), 10)
		}
		kg := KeyGroupOf(rec, b.numKG)
		at := len(d.arena)
		d.arena = format.AppendDurableKey(d.arena, kg, name, rec, ent)
		klen := len(d.arena) - at
		d.arena = append(d.arena, c.value...)
		d.recs[i] = deltaRec{off: at, klen: uint32(klen), vlen: uint32(len(c.value)), tomb: c.tomb}
	}
	return d
}

// sortDurable returns the order of n durable keys. A durable key starts with its key group,
// big endian, so a counting pass by group followed by a sort of each group's indexes gives
// that order with fewer comparisons than one sort of the whole. (A delta holds each key once.)
func sortDurable(n int, key func(int) []byte) []int32 {
	order := make([]int32, n)
	if n < 2 {
		for i := range order {
			order[i] = int32(i)
		}
		return order
	}
	numKG := 0
	for i := range n {
		numKG = max(numKG, format.DurableKeyGroup(key(i))+1)
	}
	start := make([]int, numKG+1)
	for i := range n {
		start[format.DurableKeyGroup(key(i))+1]++
	}
	for g := 1; g <= numKG; g++ {
		start[g] += start[g-1]
	}
	next := slices.Clone(start[:numKG])
	for i := range n {
		g := format.DurableKeyGroup(key(i))
		order[next[g]] = int32(i)
		next[g]++
	}
	// Within a group, the keys share a prefix (the state's name, for a one-state operator),
	// after which 8 bytes nearly always tell two keys apart: sort (those 8 bytes, index) pairs,
	// which sit together in memory, and compare whole keys only on a tie. Padding a short key
	// with zeros keeps the order: a tie falls back to the whole keys.
	var pairs []sortPair
	for g := range numKG {
		grp := order[start[g]:start[g+1]]
		if len(grp) < 2 {
			continue
		}
		first := key(int(grp[0]))[2:]
		lcp := len(first)
		for _, i := range grp[1:] {
			k := key(int(i))[2:]
			n := min(lcp, len(k))
			j := 0
			for j < n && k[j] == first[j] {
				j++
			}
			lcp = j
		}
		pairs = pairs[:0]
		for _, i := range grp {
			pairs = append(pairs, sortPair{prefix: prefix8(key(int(i))[2+lcp:]), i: i})
		}
		slices.SortFunc(pairs, func(x, y sortPair) int {
			if x.prefix != y.prefix {
				if x.prefix < y.prefix {
					return -1
				}
				return 1
			}
			return bytes.Compare(key(int(x.i))[2+lcp:], key(int(y.i))[2+lcp:])
		})
		for j := range pairs {
			grp[j] = pairs[j].i
		}
	}
	return order
}

type sortPair struct {
	prefix uint64
	i      int32
}

// prefix8 is the first 8 bytes of b, big endian, zero-padded.
func prefix8(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b)
	}
	var p [8]byte
	copy(p[:], b)
	return binary.BigEndian.Uint64(p[:])
}

// fence moves the lineage head to checkpoint s (a compare-and-swap on its etag, see casHead),
// which fails if another writer has claimed the range since. It runs once every earlier
// snapshot has committed (the etag it swaps is theirs), beside s's segment PUTs rather than
// after them: the head only fences, nothing is read through it (a restore takes the newest
// complete set of manifests), segment names are unique, and the manifest, created only once
// both are done, is what makes the checkpoint exist. A crash or a failed PUT after the fence
// leaves what a crash between the fence and the manifest always did: a head a checkpoint
// ahead of the manifests, and segments no manifest names (garbage collection removes them).
// That takes one round trip of three off every checkpoint's commit, the final one included
// (issue 10).
func (b *Tiered) fence(ctx context.Context, s *snapshot) error {
	ctx, done := b.persistContext(ctx)
	defer done()
	b.mu.Lock()
	if b.mu.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	headETag, epoch := b.mu.headETag, b.mu.epoch
	b.mu.Unlock()
	etag, err := b.casHead(ctx, headETag, b.headContent(epoch, s.id))
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.mu.headETag = etag
	b.mu.Unlock()
	return nil
}

// commit publishes what write made: a spill's segments go into the version that cold reads
// use; a checkpoint's are committed with the lineage head (unless fenced already, see fence)
// and the manifest. Commits run in capture order.
func (b *Tiered) commit(ctx context.Context, s *snapshot, w written, fenced bool) error {
	ctx, done := b.persistContext(ctx)
	defer done()

	b.mu.Lock()
	if b.mu.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	segs, written := w.segs, w.bytes
	if s.spill {
		// Publish a version with the spilled segments above everything, then (in run) mark
		// the snapshot done: the version INVARIANT holds for spills as for commits.
		b.mu.spills = slices.Concat(segs, b.mu.spills)
		b.dropMemLocked(w)
		b.setVersionLocked(b.buildVersionLocked(b.mu.base))
		merge := len(b.mu.spills) >= spillMergeAt
		b.mu.Unlock()
		s.bytes.Store(written)
		b.cnt.spillBytes.Add(written)
		if merge {
			select {
			case b.kick <- struct{}{}: // compactSpills
			default:
			}
		}
		return nil
	}
	base, comp, epoch := b.mu.base, b.mu.compaction, b.mu.epoch
	// Every spill committed so far was captured before s (commits run in capture order):
	// s's manifest adopts them, below s's own delta. Until the commit ends, compactSpills
	// leaves them in place (adopting).
	spills := slices.Clone(b.mu.spills)
	b.mu.adopting = true
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.mu.adopting = false
		b.mu.Unlock()
	}()

	// The new manifest: this delta on top of the base, with a finished compaction applied.
	m := &format.Manifest{
		Checkpoint: s.id, Parent: base.Checkpoint, NumKG: b.numKG, Rng: b.rng,
		Savepoint: s.savepoint, CreatedMS: time.Now().UnixMilli(), Epoch: epoch, OpState: s.opState,
	}
	older := base.Segs
	applied := false
	if comp != nil {
		if o, ok := comp.apply(older); ok {
			older, applied = o, true
		}
	}
	m.Segs = slices.Concat(segs, spills, older)
	enc := format.EncodeManifest(m)
	written += int64(len(enc))

	// Commit: savepoint marker, fence on the lineage head, then create the manifest.
	if s.savepoint {
		if _, err := b.s.os.put(ctx, b.root+format.SavepointName(s.id), []byte(strconv.FormatUint(s.id, 10)), putCond{}); err != nil {
			return err
		}
	}
	if !fenced {
		if err := b.fence(ctx, s); err != nil {
			return err
		}
	}
	if err := b.createOnce(ctx, b.root+format.ManifestName(s.id, b.rng), enc); err != nil {
		return err
	}

	// Publish the new version, then (in run) mark the snapshot done.
	b.mu.Lock()
	b.mu.base = m
	b.mu.spills = b.mu.spills[:len(b.mu.spills)-len(spills)] // spills are prepended: any newer stay (compactSpills left these alone)
	if applied || comp != nil && b.mu.compaction == comp {
		b.mu.compaction = nil
	}
	b.dropMemLocked(w)
	b.setVersionLocked(b.buildVersionLocked(m))
	b.mu.Unlock()

	d := time.Since(w.start)
	s.bytes.Store(written)
	b.cnt.checkpoints.Add(1)
	b.cnt.ckptBytes.Add(written)
	b.cnt.lastCkptBytes.Store(written)
	b.cnt.lastCkptNanos.Store(int64(d))
	b.cnt.ckptNanos.Add(int64(d))
	b.cnt.segments.Store(int64(len(m.Segs)))
	if applied {
		b.cnt.compactions.Add(1)
	}
	b.cnt.compactionDebt.Store(compactionDebt(m.Segs, b.cfg.maxSegments))
	select {
	case b.kick <- struct{}{}:
	default:
	}
	return nil
}

// segOut is an encoded segment.
type segOut struct {
	data   []byte
	ref    format.SegRef
	hashes []uint64 // its keys' Hash64, for the filter generations (bloomgen.go); nil if unknown
}

// encodeSegments cuts sorted entries into segments of about segmentBytes. Their references
// use the lineage's key groups. size, the entries' bytes (0 if unknown), sizes the segment
// buffers up front instead of growing them by doubling (a copy of all that came before at each
// step, on the persist's CPU).
func (b *Tiered) encodeSegments(tag string, n int, at func(int) format.SegEntry, dropTombs bool, size int) []segOut {
	var outs []segOut
	w := format.NewSegWriter(b.cfg.blockSize, b.cfg.bloomBitsPerKey)
	left := size
	reserve := func() {
		if left > 0 {
			// Prefix compression makes a segment smaller than its entries; the block
			// trailers and the index add a little.
			part := min(left, b.cfg.segmentBytes)
			w.Reserve(part+part/16, int(int64(n)*int64(part)/int64(size))+1)
			left -= part
		}
	}
	reserve()
	flush := func() {
		if w.Len() == 0 {
			return
		}
		data, info := w.Finish()
		info.Name = fmt.Sprintf("segments/%s-%05d-%05d-%s%s", tag, b.rng.Lo, b.rng.Hi, randomHex(6), segSuffix)
		outs = append(outs, segOut{data: data, ref: format.SegRef{SegInfo: info, Use: b.rng}, hashes: w.Hashes()})
		w = format.NewSegWriter(b.cfg.blockSize, b.cfg.bloomBitsPerKey)
		reserve()
	}
	for i := range n {
		e := at(i)
		if dropTombs && e.Tomb {
			continue
		}
		w.Add(e)
		if w.Size() >= b.cfg.segmentBytes {
			flush()
		}
	}
	flush()
	return outs
}

// putSegments writes segments in parallel and returns their references and bytes written.
func (b *Tiered) putSegments(ctx context.Context, outs []segOut) ([]format.SegRef, int64, error) {
	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
		total   int64
	)
	for i := range outs {
		total += int64(len(outs[i].data))
		wg.Add(1)
		go func(o *segOut) {
			defer wg.Done()
			if err := b.s.acquire(ctx); err != nil {
				errOnce.Do(func() { first = err })
				return
			}
			defer b.s.release()
			if _, err := b.s.os.put(ctx, b.root+o.ref.Name, o.data, putCond{}); err != nil {
				errOnce.Do(func() { first = err })
			}
		}(&outs[i])
	}
	wg.Wait()
	if first != nil {
		return nil, 0, first
	}
	refs := make([]format.SegRef, len(outs))
	for i, o := range outs {
		refs[i] = o.ref
	}
	return refs, total, nil
}

const segSuffix = ".seg"

// putSegment finishes w and writes it as one segment named after tag.
func (b *Tiered) putSegment(ctx context.Context, tag string, w *format.SegWriter) (format.SegRef, error) {
	data, info := w.Finish()
	info.Name = fmt.Sprintf("segments/%s-%05d-%05d-%s%s", tag, b.rng.Lo, b.rng.Hi, randomHex(6), segSuffix)
	if err := b.s.acquire(ctx); err != nil {
		return format.SegRef{}, err
	}
	defer b.s.release()
	if _, err := b.s.os.put(ctx, b.root+info.Name, data, putCond{}); err != nil {
		return format.SegRef{}, err
	}
	b.wrote(info.Name, data, info)
	return format.SegRef{SegInfo: info, Use: b.rng}, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// headContent is the lineage head: who holds the range, at which epoch, at which checkpoint.
func (b *Tiered) headContent(epoch, ckpt uint64) []byte {
	return fmt.Appendf(nil, "clink-head v1 epoch=%d checkpoint=%d writer=%s\n", epoch, ckpt, b.token)
}

func parseHeadEpoch(data []byte) uint64 {
	for _, f := range strings.Fields(string(data)) {
		if v, ok := strings.CutPrefix(f, "epoch="); ok {
			n, _ := strconv.ParseUint(v, 10, 64)
			return n
		}
	}
	return 0
}

// claimHead takes over the lineage head of this backend's key-group range, bumping its epoch.
// Any older writer of the range is fenced: its next head update fails its If-Match.
func (b *Tiered) claimHead(ctx context.Context) error {
	name := b.root + format.HeadName(b.rng)
	for attempt := 0; attempt < 8; attempt++ {
		info, err := b.s.os.head(ctx, name)
		var epoch uint64
		var c putCond
		switch {
		case errors.Is(err, ErrNotFound):
			c.ifAbsent = true
		case err != nil:
			return err
		default:
			data, err := b.s.os.get(ctx, name, 0, -1)
			if err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
			epoch = parseHeadEpoch(data)
			c.ifMatch = info.etag
		}
		epoch++
		content := b.headContent(epoch, 0)
		etag, err := b.s.os.put(ctx, name, content, c)
		if errors.Is(err, errPrecondition) {
			// Raced with another claimant, or our own put landed and was retried: re-check.
			own, tag, rerr := b.ownWrite(ctx, name, content)
			switch {
			case rerr != nil:
				return rerr
			case own:
				etag, err = tag, nil
			}
		}
		if errors.Is(err, errPrecondition) {
			continue
		}
		if err != nil {
			return err
		}
		b.mu.Lock()
		b.mu.headETag, b.mu.epoch = etag, epoch
		b.mu.Unlock()
		return b.retireOverlapping(ctx)
	}
	return &Error{Op: "claim", Object: name, Err: ErrFenced}
}

// retireOverlapping fences writers of other key-group ranges that overlap this backend's (the
// subtasks of an earlier parallelism, after a rescale): it rewrites their heads, so their next
// commit fails its If-Match. Heads that are already retired are left alone.
func (b *Tiered) retireOverlapping(ctx context.Context) error {
	objs, err := b.s.os.list(ctx, b.root+"heads/")
	if err != nil {
		return err
	}
	for _, o := range objs {
		var r KeyGroupRange
		if _, err := fmt.Sscanf(strings.TrimPrefix(o.name, b.root+"heads/"), "%05d-%05d", &r.Lo, &r.Hi); err != nil {
			continue
		}
		if r == b.rng || !r.Overlaps(b.rng) {
			continue
		}
		for attempt := 0; attempt < 4; attempt++ {
			info, err := b.s.os.head(ctx, o.name)
			if errors.Is(err, ErrNotFound) {
				break
			}
			if err != nil {
				return err
			}
			data, err := b.s.os.get(ctx, o.name, 0, -1)
			if err != nil {
				return err
			}
			if bytes.HasPrefix(data, []byte("clink-head v1 retired")) {
				break
			}
			retired := fmt.Appendf(nil, "clink-head v1 retired epoch=%d by=%s range=%v\n", parseHeadEpoch(data)+1, b.token, b.rng)
			if _, err := b.s.os.put(ctx, o.name, retired, putCond{ifMatch: info.etag}); err == nil {
				break
			} else if !errors.Is(err, errPrecondition) {
				return err
			}
		}
	}
	return nil
}

// ownWrite reports whether name holds exactly data: after a conditional put failed its
// condition, it tells an earlier attempt of ours that landed (the SDK retried a put whose
// response was lost) from another writer's. The read-back retries transient errors; if it still
// cannot tell, the outcome is unknown and the error is retryable, never ErrFenced.
func (b *Tiered) ownWrite(ctx context.Context, name string, data []byte) (bool, string, error) {
	var last error
	for attempt := 0; attempt < 4; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return false, "", ctx.Err()
			case <-time.After(time.Duration(attempt) * 20 * time.Millisecond):
			}
		}
		got, err := b.s.os.get(ctx, name, 0, -1)
		if errors.Is(err, ErrNotFound) {
			return false, "", nil
		}
		if err == nil {
			if !bytes.Equal(got, data) {
				return false, "", nil
			}
			info, err := b.s.os.head(ctx, name)
			if err == nil {
				return true, info.etag, nil
			}
			last = err
		} else {
			last = err
		}
		if !IsRetryable(last) {
			break
		}
	}
	return false, "", &Error{Op: "commit", Object: name, Retryable: true,
		Err: fmt.Errorf("a conditional write's outcome is unknown (reading it back failed): %w", last)}
}

// casHead replaces the lineage head if it still has etag. A failed condition means a newer
// writer claimed the range: ErrFenced. An ambiguous earlier attempt that did land (the SDK
// retried a put whose response was lost) is recognised by content and treated as success.
//
// A head that holds another of our own writes (our writer token, our epoch) is not a fence
// either: an earlier commit's head update whose outcome was unknown (it failed after its retries
// while the write itself landed) moved the etag on. Only we write heads with our token, so the
// update is retried on top of it.
func (b *Tiered) casHead(ctx context.Context, etag string, content []byte) (string, error) {
	name := b.root + format.HeadName(b.rng)
	for attempt := 0; ; attempt++ {
		newTag, err := b.s.os.put(ctx, name, content, putCond{ifMatch: etag})
		if !errors.Is(err, errPrecondition) {
			return newTag, err
		}
		own, tag, rerr := b.ownWrite(ctx, name, content)
		switch {
		case rerr != nil:
			return "", rerr
		case own:
			return tag, nil
		}
		if attempt < 3 {
			cur, curTag, rerr := b.ownHead(ctx, name)
			if rerr != nil {
				return "", rerr
			}
			if cur {
				etag = curTag
				continue
			}
		}
		return "", &Error{Op: "commit", Object: name, Err: ErrFenced}
	}
}

// ownHead reports whether the lineage head was last written by this backend (its writer token
// and epoch), and its etag. A head that changes while it is read is not reported as ours.
func (b *Tiered) ownHead(ctx context.Context, name string) (bool, string, error) {
	info, err := b.s.os.head(ctx, name)
	if err != nil {
		return false, "", err
	}
	data, err := b.s.os.get(ctx, name, 0, -1)
	if err != nil {
		return false, "", err
	}
	// The etag must be that of the content read: unchanged across the read.
	if again, err := b.s.os.head(ctx, name); err != nil {
		return false, "", err
	} else if again.etag != info.etag {
		return false, "", nil
	}
	b.mu.Lock()
	epoch := b.mu.epoch
	b.mu.Unlock()
	mine := bytes.HasPrefix(data, []byte("clink-head v1 epoch=")) && parseHeadEpoch(data) == epoch &&
		bytes.Contains(data, []byte(" writer="+b.token+"\n"))
	return mine, info.etag, nil
}

// createOnce creates an immutable object that must not exist yet (If-None-Match: *). If it
// exists with exactly our bytes, an earlier attempt of ours landed: success.
func (b *Tiered) createOnce(ctx context.Context, name string, data []byte) error {
	_, err := b.s.os.put(ctx, name, data, putCond{ifAbsent: true})
	if errors.Is(err, errPrecondition) {
		own, _, rerr := b.ownWrite(ctx, name, data)
		switch {
		case rerr != nil:
			return rerr
		case own:
			return nil
		}
		return &Error{Op: "commit", Object: name, Err: ErrFenced}
	}
	return err
}

// restore reads the manifests of checkpoint ckpt (or the newest complete one) that overlap this
// backend's key groups, and returns the lineage's base manifest and the restored operator
// state. It reads manifests only: segment indexes load lazily.
func (b *Tiered) restore(ctx context.Context, ckpt uint64) (*format.Manifest, map[string][]RangeBlob, error) {
	if ckpt == RestoreLatest {
		objs, err := b.s.os.list(ctx, b.root+"manifests/")
		if err != nil {
			return nil, nil, err
		}
		names := make([]string, len(objs))
		for i, o := range objs {
			names[i] = strings.TrimPrefix(o.name, b.root)
		}
		complete := format.CompleteCheckpoints(names, b.numKG)
		if len(complete) == 0 {
			return nil, nil, nil // nothing to restore: start empty
		}
		ckpt = complete[0]
	}
	prefix := b.root + fmt.Sprintf("manifests/%020d/", ckpt)
	objs, err := b.s.os.list(ctx, prefix)
	if err != nil {
		return nil, nil, err
	}
	var ms []*format.Manifest
	var rs []KeyGroupRange
	for _, o := range objs {
		_, r, ok := format.ParseManifestName(strings.TrimPrefix(o.name, b.root))
		if !ok || !r.Overlaps(b.rng) {
			continue
		}
		data, err := b.s.os.get(ctx, o.name, 0, -1)
		if err != nil {
			return nil, nil, err
		}
		m, err := format.DecodeManifest(o.name, data)
		if err != nil {
			b.cnt.corruptions.Add(1)
			return nil, nil, err
		}
		if m.NumKG != b.numKG {
			return nil, nil, fmt.Errorf("state: checkpoint %d of %s has %d key groups, want %d", ckpt, b.name, m.NumKG, b.numKG)
		}
		ms = append(ms, m)
		rs = append(rs, m.Rng)
	}
	for i := range rs {
		for j := i + 1; j < len(rs); j++ {
			if rs[i].Overlaps(rs[j]) {
				return nil, nil, fmt.Errorf("state: checkpoint %d of %s has overlapping manifests %v and %v (two writers used the same checkpoint id)", ckpt, b.name, rs[i], rs[j])
			}
		}
	}
	if !format.Covers(rs, b.rng) {
		return nil, nil, &Error{Op: "restore", Object: prefix, Err: fmt.Errorf("checkpoint %d does not cover key groups %v: %w", ckpt, b.rng, ErrNotFound)}
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Rng.Lo < ms[j].Rng.Lo })
	base := &format.Manifest{Checkpoint: ckpt, NumKG: b.numKG, Rng: b.rng}
	ops := map[string][]RangeBlob{}
	for _, m := range ms {
		// Lineages own disjoint key groups, so their segments never hold the same key and
		// their order relative to each other does not matter; within one, newest first.
		for _, s := range m.Segs {
			use := s.Use.Intersect(m.Rng).Intersect(b.rng)
			if use.Empty() || use.Lo > s.KGHi || use.Hi <= s.KGLo {
				continue
			}
			s.Use = use
			base.Segs = append(base.Segs, s)
		}
		for _, o := range m.OpState {
			ops[o.Name] = append(ops[o.Name], RangeBlob{Range: m.Rng, Data: o.Data})
		}
	}
	return base, ops, nil
}

// fetchReq is one key of a Fetch, encoded on the runner.
type fetchReq struct {
	idx  int
	kg   int
	dk   []byte
	h    uint64
	done bool // resolveBlock found it (a value or a tombstone)
}

// lookup resolves reqs against version v: each key is found in the newest segment that holds
// it. It works in rounds, each one remote round trip whatever the number of segments:
//   - the indexes and filters of every segment that may hold an open key are loaded (in
//     parallel, once per segment);
//   - each open key lists its candidate blocks, newest segment first: those whose segment's
//     filter and index may hold it, from the segment it has reached on;
//   - the first candidate of every key is read, all in parallel, each block once with a ranged
//     GET (in later rounds, every candidate of the keys left);
//   - each key walks its candidates while they were read this round, and stops at the first
//     that holds it. One that reaches a candidate not read (its filter lied about every block
//     before) waits for the next round, which starts there.
//
// Segments one after the other, as it was, cost a spilled tier one round trip per segment a
// batch touched (issue 10); reading every candidate at once would cost one GET per filter
// false positive.
//
// A key is resolved as soon as the blocks it walks are in, and answered (called with its idx,
// on this goroutine) then, not at the end of the round: a lookup of many Fetches' keys makes
// 8-10 GETs at once, and a Fetch that waited for the slowest of them waited 1.6-2.5x the mean
// GET (issue 10). answered may be nil.
func (b *Tiered) lookup(ctx context.Context, v *version, reqs []fetchReq, out []Fetched, answered func(idx int)) error {
	if answered == nil {
		answered = func(int) {}
	}
	sort.Slice(reqs, func(i, j int) bool { return bytes.Compare(reqs[i].dk, reqs[j].dk) < 0 })
	open := make([]*fetchReq, len(reqs))
	for i := range reqs {
		open[i] = &reqs[i]
	}
	from := make([]int, len(out)) // per request (by idx): the first segment it may still be in
	in := func(seg *liveSeg, r *fetchReq) bool {
		return seg.ref.Use.Contains(r.kg) && bytes.Compare(r.dk, seg.ref.MinKey) >= 0 && bytes.Compare(r.dk, seg.ref.MaxKey) <= 0
	}
	type blockRef struct{ seg, block int }
	type walk struct {
		r     *fetchReq
		cands []blockRef
	}
	read := map[blockRef][]byte{} // blocks read so far, kept across rounds
	for round := 0; len(open) > 0; round++ {
		pending := map[blockRef]bool{} // blocks this round reads, until they are in
		if err := b.loadMetas(ctx, v, open, from, in); err != nil {
			return err
		}
		walks := make([]walk, 0, len(open))
		var order []blockRef
		var candBuf []blockRef // the walks' candidates, one after the other
		for _, r := range open {
			w := walk{r: r}
			// A filter generation that rules the key out does so for all its segments at once
			// (bloomgen.go), as in mayBeDurable.
			var no uint8
			for j := range v.gens {
				if !v.gens[j].MayContain(r.h) {
					no |= 1 << j
				}
			}
			start := len(candBuf)
			for i := from[r.idx]; i < len(v.segs); i++ {
				if no != 0 {
					if g := v.segGen[i]; g >= 0 && no&(1<<g) != 0 {
						continue
					}
				}
				seg := v.segs[i]
				if !in(seg, r) {
					continue
				}
				m := seg.meta.Load()
				if !m.Bloom.MayContain(r.h) {
					continue
				}
				if bi := m.Find(r.dk); bi >= 0 {
					candBuf = append(candBuf, blockRef{i, bi})
				}
			}
			w.cands = candBuf[start:len(candBuf):len(candBuf)]
			if len(w.cands) == 0 {
				answered(r.idx) // no segment may hold it: absent, out[idx] stays not found
				continue
			}
			// The first round reads each key's first candidate, and the ones before it in
			// segments still in memory (which cost no request, so a filter that lies about one
			// costs no round trip); a later one, for the few keys a filter lied to, all their
			// candidates, so that a chain of false positives does not cost a round trip each.
			n := 1
			for n < len(w.cands) && v.segs[w.cands[n-1].seg].mem != nil {
				n++
			}
			cs := w.cands[:n]
			if round > 0 {
				cs = w.cands
			}
			for _, c := range cs {
				if _, ok := read[c]; !ok && !pending[c] {
					pending[c] = true
					order = append(order, c)
				}
			}
			walks = append(walks, w)
		}
		// The blocks of one segment are read together: runs of them no further apart than
		// rangeGap (or a block) go in one ranged GET of at most rangeMax bytes. A GET costs
		// about the same whatever its size up to hundreds of KiB (latency and per-request CPU
		// dominate), so a batch that needs many blocks of a segment pays one request for them,
		// not one each.
		sort.Slice(order, func(i, j int) bool {
			if order[i].seg != order[j].seg {
				return order[i].seg < order[j].seg
			}
			return order[i].block < order[j].block
		})
		type span struct{ from, to int } // order[from:to], one GET
		var spans []span
		gap, most := max(int64(b.cfg.blockSize), rangeGap), max(int64(b.cfg.blockSize), rangeMax)
		for i := 0; i < len(order); {
			j := i + 1
			blocks := v.segs[order[i].seg].meta.Load().Blocks
			first := blocks[order[i].block]
			for j < len(order) && order[j].seg == order[i].seg {
				prev, next := blocks[order[j-1].block], blocks[order[j].block]
				if next.Off-(prev.Off+prev.N) > gap || next.Off+next.N-first.Off > most {
					break
				}
				j++
			}
			spans = append(spans, span{i, j})
			i = j
		}
		// Every span's GET starts at once; the runner-facing side (this goroutine) walks the
		// keys waiting at a span's blocks as soon as its GET is in.
		datas := make([][]byte, len(order))
		errs := make([]error, len(spans))
		arrived := make(chan int, len(spans))
		for si, sp := range spans {
			go func() {
				seg := v.segs[order[sp.from].seg]
				blocks := seg.meta.Load().Blocks
				bhs := make([]format.BlockHandle, 0, sp.to-sp.from)
				for _, br := range order[sp.from:sp.to] {
					bhs = append(bhs, blocks[br.block])
				}
				var got [][]byte
				got, errs[si] = b.fetchBlocks(ctx, seg, bhs)
				copy(datas[sp.from:sp.to], got)
				arrived <- si
			}()
		}
		// A walk stands at its first candidate: walked now if that block is in (ready), waiting
		// for it if this round reads it, else left for the next round, which starts there.
		ready := map[blockRef][]*walk{}
		var readyOrder []blockRef
		waiting := map[blockRef][]*walk{}
		var next []*fetchReq
		place := func(w *walk) {
			c := w.cands[0]
			if _, ok := read[c]; ok {
				if ready[c] == nil {
					readyOrder = append(readyOrder, c)
				}
				ready[c] = append(ready[c], w)
			} else if pending[c] {
				waiting[c] = append(waiting[c], w)
			} else {
				from[w.r.idx] = c.seg
				next = append(next, w.r)
			}
		}
		// walkReady resolves, block by block, the keys standing at blocks that are in (in key
		// order, as blocks are); those a block does not hold step to their next candidate.
		walkReady := func() error {
			for len(readyOrder) > 0 {
				c := readyOrder[0]
				readyOrder = readyOrder[1:]
				ws := ready[c]
				delete(ready, c)
				sort.Slice(ws, func(i, j int) bool { return bytes.Compare(ws[i].r.dk, ws[j].r.dk) < 0 })
				rs := make([]*fetchReq, len(ws))
				for i, w := range ws {
					rs[i] = w.r
				}
				seg := v.segs[c.seg]
				if err := resolveBlock(seg.object, seg.meta.Load().Blocks[c.block], read[c], rs, out); err != nil {
					b.cnt.corruptions.Add(1)
					return err
				}
				for _, w := range ws {
					if w.r.done || len(w.cands) == 1 {
						answered(w.r.idx)
						continue
					}
					w.cands = w.cands[1:]
					place(w)
				}
			}
			return nil
		}
		for i := range walks {
			place(&walks[i])
		}
		err := walkReady()
		for range spans {
			si := <-arrived // every GET has finished before the lookup returns
			if err != nil || errs[si] != nil {
				continue
			}
			sp := spans[si]
			// Counted as the GET arrives, before its keys are answered: a caller that reads the
			// metrics once its Fetch is answered sees its blocks beside its GETs.
			b.cnt.fetchBlocks.Add(int64(sp.to - sp.from))
			for i := sp.from; i < sp.to; i++ {
				c := order[i]
				read[c] = datas[i]
				delete(pending, c)
				for _, w := range waiting[c] {
					if ready[c] == nil {
						readyOrder = append(readyOrder, c)
					}
					ready[c] = append(ready[c], w)
				}
				delete(waiting, c)
			}
			err = walkReady()
		}
		if err := errors.Join(append(errs, err)...); err != nil {
			return err
		}
		if round > 0 {
			b.cnt.fetchRounds.Add(1)
		}
		open = next
		sort.Slice(open, func(i, j int) bool { return bytes.Compare(open[i].dk, open[j].dk) < 0 })
	}
	return nil
}

// loadMetas loads, in parallel, the index and filter of every segment of v that one of the open
// requests may be in (at or after the segment it has reached) and that is not loaded yet.
func (b *Tiered) loadMetas(ctx context.Context, v *version, open []*fetchReq, from []int, in func(*liveSeg, *fetchReq) bool) error {
	var missing []*liveSeg
	for i, seg := range v.segs {
		if seg.meta.Load() != nil {
			continue
		}
		for _, r := range open {
			if from[r.idx] <= i && in(seg, r) {
				missing = append(missing, seg)
				break
			}
		}
	}
	if len(missing) == 1 {
		_, err := b.loadMeta(ctx, missing[0])
		return err
	}
	errs := make([]error, len(missing))
	var wg sync.WaitGroup
	for i, seg := range missing {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = b.loadMeta(ctx, seg)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// rangeMax bounds one ranged GET of blocks, and rangeGap the bytes it may read between two
// blocks it needs (see lookup): at S3's ~20 ms and ~100 MB/s a connection, 64 KiB more costs
// under a millisecond, a request more costs a round trip and its CPU on both ends.
const (
	rangeMax = 1 << 20
	rangeGap = 64 << 10
)

// fetchBlocks reads blocks of one segment, sorted by offset, with one ranged GET from the first
// to the end of the last, and verifies each. A range with a block that fails its checksum is
// read once more (corruption in transit), then reported.
//
// A segment still in memory (see Tiered.mu.mem) is read from there.
func (b *Tiered) fetchBlocks(ctx context.Context, seg *liveSeg, bhs []format.BlockHandle) ([][]byte, error) {
	object := seg.object
	off := bhs[0].Off
	n := bhs[len(bhs)-1].Off + bhs[len(bhs)-1].N - off
	for attempt := 0; ; attempt++ {
		var data []byte
		var err error
		if seg.mem != nil {
			if off+n > int64(len(seg.mem)) {
				return nil, format.Corruptf(object, off, "block beyond the segment's %d bytes", len(seg.mem))
			}
			data = seg.mem[off : off+n]
		} else {
			if err := b.s.acquire(ctx); err != nil {
				return nil, err
			}
			data, err = b.s.os.get(ctx, object, off, n)
			b.s.release()
		}
		if err != nil {
			return nil, err
		}
		out := make([][]byte, len(bhs))
		if int64(len(data)) != n {
			err = format.Corruptf(object, off, "short read: %d of %d bytes", len(data), n)
		}
		for i, bh := range bhs {
			if err != nil {
				break
			}
			out[i] = data[bh.Off-off : bh.Off-off+bh.N : bh.Off-off+bh.N]
			_, err = format.OpenBlock(object, bh.Off, out[i])
		}
		if err == nil {
			return out, nil
		}
		if attempt == 1 {
			b.cnt.corruptions.Add(1)
			return nil, err
		}
	}
}

// resolveBlock resolves the sorted requests found in a block that fetchBlocks verified: each
// one the block holds (a value or a tombstone) is marked done, and a value is copied into out,
// the block's values sharing one allocation.
func resolveBlock(object string, bh format.BlockHandle, data []byte, rs []*fetchReq, out []Fetched) error {
	it, err := format.OpenVerifiedBlock(object, bh.Off, data)
	if err != nil {
		return err
	}
	var vals []byte
	for _, r := range rs {
		if !it.Seek(r.dk) {
			break // past the block's last key: the rest are not in it
		}
		if !bytes.Equal(it.Key, r.dk) {
			continue
		}
		r.done = true
		f := &out[r.idx]
		f.Found = !it.Tomb
		if f.Found {
			if cap(vals)-len(vals) < len(it.Value) {
				vals = make([]byte, 0, max(len(it.Value), 8*len(rs)))
			}
			n := len(vals)
			vals = append(vals, it.Value...)
			f.Value = vals[n:len(vals):len(vals)]
		}
	}
	return it.Err
}

// loadMeta returns a segment's index and filter, reading them (one ranged GET) on first use.
func (b *Tiered) loadMeta(ctx context.Context, s *liveSeg) (*format.SegMeta, error) {
	if m := s.meta.Load(); m != nil {
		return m, nil
	}
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	if m := s.meta.Load(); m != nil {
		return m, nil
	}
	var m *format.SegMeta
	if s.mem != nil {
		if s.ref.MetaOff+s.ref.MetaLen > int64(len(s.mem)) {
			return nil, format.Corruptf(s.object, s.ref.MetaOff, "meta beyond the segment's %d bytes", len(s.mem))
		}
		// A copy: the meta outlives the segment's bytes in memory.
		var err error
		if m, err = format.DecodeSegMeta(s.object, bytes.Clone(s.mem[s.ref.MetaOff:s.ref.MetaOff+s.ref.MetaLen]), s.ref.MetaOff); err != nil {
			b.cnt.corruptions.Add(1)
			return nil, err
		}
	} else {
		var err error
		if m, err = b.readMeta(ctx, s.object, s.ref); err != nil {
			return nil, err
		}
	}
	s.meta.Store(m)
	b.cnt.metaLoads.Add(1)
	b.countIndexes(b.version.Load())
	return m, nil
}

// readMeta reads and decodes a durable segment's meta (its block index and filter) with one
// ranged GET.
func (b *Tiered) readMeta(ctx context.Context, object string, ref format.SegRef) (*format.SegMeta, error) {
	if err := b.s.acquire(ctx); err != nil {
		return nil, err
	}
	data, err := b.s.os.get(ctx, object, ref.MetaOff, ref.MetaLen)
	b.s.release()
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != ref.MetaLen {
		b.cnt.corruptions.Add(1)
		return nil, format.Corruptf(object, ref.MetaOff, "short meta: %d of %d bytes", len(data), ref.MetaLen)
	}
	m, err := format.DecodeSegMeta(object, data, ref.MetaOff)
	if err != nil {
		b.cnt.corruptions.Add(1)
		return nil, err
	}
	return m, nil
}

// prefetch loads the indexes of a restored version in the background, two at a time.
func (b *Tiered) prefetch(v *version) {
	defer b.wg.Done()
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for _, s := range v.segs {
		if b.ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func(s *liveSeg) {
			defer wg.Done()
			defer func() { <-sem }()
			_, _ = b.loadMeta(b.ctx, s) // errors resurface on the read that needs the segment
		}(s)
	}
	wg.Wait()
}
