package state

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/clink-wasm/clink-wasm/host/state/internal/format"
)

// entryOverhead is what one hot entry costs beyond its key and value bytes (the 128-byte entry
// object, the map's slot and its share of the map's buckets), counted in the hot-tier byte
// accounting. Measured: an 8-byte counter under a 10-byte key costs 163 bytes of heap over 200k
// keys, 145 beyond its key and value. A key or value too long to be inline costs its own
// allocation besides, which its length stands for.
const entryOverhead = 145

// entry is one key in the hot tier.
//
// # Generations
//
// Every write belongs to a generation: the capture sequence of the delta it will go out in
// (Tiered.run.captureSeq+1 while it is being written). A capture is O(1): it ends the current
// generation by handing its list of entries to the snapshot, and writes after it start the
// next. The persist, off the runner, reads each captured entry's value of its generation
// through the entry's cells:
//   - c is the entry's current cell. The runner writes a generation's value in place while the
//     generation is current, and never again once it is captured: the first write of a later
//     generation goes to another cell (own, or a new one) whose prev is the captured one, so a
//     persist walks from c down to the cell of its generation;
//   - a cell whose generation is settled (its snapshot's outcome observed by the runner) is
//     read by no persist, so the runner reuses it in place;
//   - persists encode one at a time in capture order, so once one has read its cell, nothing
//     below it is read again: it cuts the cell's prev, and chains never outgrow the pending
//     snapshots.
//
// The persist reads only key (immutable), c and prev (atomic), and the fields of cells of its
// own generation, which the runner no longer writes. Everything else is runner-owned.
type entry struct {
	key string // AppendKey encoding; never changes
	c   atomic.Pointer[cell]
	own cell // the entry's first cell, reused whenever no persist may read it
	// prev, next link the entry into one list: the LRU list when it is clean, the current
	// generation's list when it is dirty, or its pending snapshot's list when it is captured.
	// INVARIANT: a dirty or pinned entry is never in the LRU list.
	prev, next *entry
	size       int64
	// holds counts the records that need this entry before their call runs (Hold). INVARIANT:
	// a held entry is never evicted (it may sit in the LRU list after a commit moved its
	// generation there; eviction then takes it out of the list instead).
	holds int32
	// written: changed locally at some point, so the durable tier may hold a newer value than
	// a fetch that started before the change (see fillGuard).
	written bool
	linked  bool
	// freq counts the entry's hits while it is hot, up to maxFreq, and halves each time the
	// eviction spares it (see maybeEvict).
	freq uint8
	kbuf [smallKey]byte // key's bytes when they fit (see newEntry)
	// The fields are ordered, and smallKey and smallValue sized, for an entry of 128 bytes
	// (a size class): with the map's slot, 163 bytes of heap per 8-byte counter, as when the
	// key and value were objects of their own (measured over 200k keys).
}

// cell is one generation's value of an entry.
type cell struct {
	// gen is the generation the value belongs to; 0 for a value filled from the durable tier
	// (clean from the start).
	gen   uint64
	value []byte // in small when it fits
	prev  atomic.Pointer[cell]
	small [smallValue]byte
	tomb  bool // deleted, or known absent from the durable tier
}

// smallValue is the largest value a cell holds inline, and smallKey the largest key an entry
// does: a hot tier of counters is then one object per key for the GC to mark, not three (the
// entry, its key and its value), and its writes allocate nothing.
const (
	smallValue = 8
	smallKey   = 17
)

// set writes v as the cell's value: inline when it fits, else in place when the current
// buffer is large enough (the caller owns the cell: see entry).
func (c *cell) set(v []byte) {
	switch {
	case len(v) <= smallValue:
		c.value = append(c.small[:0], v...)
	case cap(c.value) < len(v) || c.tomb:
		c.value = append([]byte(nil), v...)
	default:
		c.value = append(c.value[:0], v...)
	}
}

// newEntry returns an entry for the AppendKey encoding k (copied), without a generation.
func newEntry(k []byte) *entry {
	e := &entry{}
	if len(k) <= smallKey {
		n := copy(e.kbuf[:], k)
		e.key = unsafe.String(&e.kbuf[0], n) // e.kbuf is never written again
	} else {
		e.key = string(k)
	}
	return e
}

// Tiered is the tiered Backend of one operator subtask: a hot in-memory tier with LRU eviction
// under a byte budget, in front of segments in the Store's durable pool. Get it from
// Store.Operator.
//
// # Threading
//
// The runner-side methods (Open, Get, Put, Delete, Fill, Fetch's issuing half, Capture and the
// operator-state methods) must be called by one goroutine at a time, the subtask's runner; they
// take no locks. Fetch's IO, Persist and background compaction run on other goroutines and
// communicate with the runner only through atomics (version, events) and the mutex-guarded mu.
type Tiered struct {
	s      *Store
	cfg    *config
	name   string
	tenant string
	root   string // object-name prefix of the operator
	numKG  int
	rng    KeyGroupRange
	member *budgetMember
	cnt    backendCounters
	token  string // random writer token, written into the lineage head

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	kick   chan struct{} // wakes the maintenance goroutine
	wg     sync.WaitGroup
	// persists counts the persist goroutines (snapshot.start), which Close waits for.
	persists sync.WaitGroup
	// plainLRU turns the frequency-aware eviction off (tests compare the two).
	plainLRU bool
	// fq queues Fetches while maxLookups lookups run (see Fetch).
	fq struct {
		sync.Mutex
		running int
		queue   []*fetchJob
	}

	// version is the committed durable view that cold reads use. INVARIANT: a new version is
	// published before the snapshot that produced it is marked done, so by the time the runner
	// sees a commit (and may evict the committed keys) every later Fetch reads a version that
	// has them.
	version atomic.Pointer[version]
	// indexBytes is what the loaded metas of the newest version hold (see countIndexes),
	// counted in the hot budget.
	indexBytes atomic.Int64
	events     atomic.Uint64 // bumped when a snapshot finishes; the runner polls it

	// run is runner-owned. INVARIANT: only the runner touches it.
	run struct {
		names []string
		hot   map[string]*entry
		// last is the entry find found last (nil after it was evicted): a record's call reads
		// its key's state, then writes it, and the write's lookup is then a comparison.
		last *entry
		// lru is the sentinel of the LRU list (lru.next is most recent). INVARIANT: it holds
		// clean entries only, and every clean entry no record holds.
		lru entry
		// gen is the sentinel of the current generation's list: the dirty entries, which dirty
		// also holds (the snapshot's copy that its persist reads).
		gen        entry
		dirty      []*entry
		bytes      int64
		dirtyBytes int64 // sizes of the dirty entries, a part of bytes
		// pinnedOut is what pending snapshots hold: the sizes of their entries (pinned) until
		// they are readable, then what their segments hold in memory (memBytes).
		pinnedOut int64
		// memBytes is what encoded segments hold in memory (Tiered.mu.mem), counted in the
		// budget: those of readable pending snapshots and the carried ones of failed ones.
		memBytes int64
		// readable lists the generations of pending snapshots seen readable: their entries
		// are clean (evictable, and no persist reads their cells).
		readable   []uint64
		captureSeq uint64 // the current generation is captureSeq+1
		// settled is the highest capture seq whose outcome the runner has observed: an entry
		// whose cell's generation is at most settled is clean (a failed delta's entries were
		// made dirty again when it was observed), and no persist reads that cell.
		settled    uint64
		seenEvents uint64
		pending    []*snapshot // captured, outcome not yet observed, in capture order
		opState    map[string][]byte
		restoredOp map[string][]RangeBlob
		scratch    []byte
		dkey       []byte
		guard      fillGuard
	}

	mu struct {
		sync.Mutex
		base       *format.Manifest // last committed (or restored) manifest of this lineage
		headETag   string
		epoch      uint64
		live       map[string]*liveSeg
		compaction *compactResult // merged segments waiting for the next commit
		closed     bool
		lastGC     time.Time
		gcCache    map[string][]string // manifest name -> segment names (manifests are immutable)
		// spills are the segments of spilled deltas (see spill) not yet adopted by a
		// checkpoint, newest first. Cold reads see them (the version puts them above base);
		// the next checkpoint's manifest lists them, then they are cleared.
		spills []format.SegRef
		// adopting: a checkpoint's commit is adopting the spills (see compactSpills).
		adopting bool
		// merging: compactSpills is merging spills (it reads them back from the pool); the
		// tests that count a Fetch's GETs wait for it (see waitMerges).
		merging bool
		// mem are encoded segments held in memory until a commit makes them durable, newest
		// first: the deltas in flight (each readable once encoded, see snapshot.readable) and
		// the carried segments of failed ones. Cold reads see them above everything else.
		mem []memSeg
		// written are the metas of segments this backend wrote, decoded from the bytes it
		// put, for buildVersionLocked to install so that no cold read GETs them back.
		// Bounded: cleared past maxWrittenMetas (a read then loads one, as after a restore).
		written map[string]*format.SegMeta
		// gens are the filter generations over the segments this backend published
		// (bloomgen.go).
		gens genState
	}
}

// RangeBlob is an operator-state blob restored from the subtask that owned Range.
type RangeBlob struct {
	Range KeyGroupRange
	Data  []byte
}

var _ Backend = (*Tiered)(nil)

// version is an immutable view of the durable tier: live segments, newest first.
type version struct {
	segs    []*liveSeg
	covered []bool // per key group: some segment may hold it
	// gens are the filter generations of its segments (bloomgen.go); segGen[i] is the index in
	// gens of segs[i]'s, or -1.
	gens   []format.Bloom
	segGen []int8
}

// liveSeg is a segment in use; its meta (index + bloom) is loaded on first need and shared by
// every version that contains the segment.
type liveSeg struct {
	ref    format.SegRef
	object string
	mem    []byte // the segment's bytes while it is in Tiered.mu.mem; reads use them
	meta   atomic.Pointer[format.SegMeta]
	loadMu sync.Mutex
}

func newTiered(ctx context.Context, s *Store, o OperatorOptions) (*Tiered, error) {
	b := &Tiered{
		s: s, cfg: &s.cfg, name: o.Name, tenant: o.Tenant, root: operatorRoot(o.Tenant, o.Name),
		numKG: o.NumKeyGroups, rng: o.KeyGroups,
		member: &budgetMember{tenant: o.Tenant, op: o.Name, fixed: o.HotBytes},
		kick:   make(chan struct{}, 1),
		token:  randomHex(8),
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.run.hot = map[string]*entry{}
	b.run.lru.next, b.run.lru.prev = &b.run.lru, &b.run.lru
	b.run.gen.next, b.run.gen.prev = &b.run.gen, &b.run.gen
	b.run.opState = map[string][]byte{}
	b.run.guard.init()
	b.mu.live = map[string]*liveSeg{}
	b.mu.gcCache = map[string][]string{}
	if o.HotBytes > 0 {
		b.member.limit.Store(o.HotBytes)
	} else {
		b.member.limit.Store(s.cfg.hotBytes)
	}

	base := &format.Manifest{NumKG: b.numKG, Rng: b.rng}
	if o.RestoreFrom != 0 {
		m, ops, err := b.restore(ctx, o.RestoreFrom)
		if err != nil {
			b.cancel()
			return nil, err
		}
		if m != nil {
			base = m
			b.run.restoredOp = ops
			if rs := ops; len(rs) > 0 {
				for name, blobs := range rs {
					if len(blobs) == 1 && blobs[0].Range == b.rng {
						b.run.opState[name] = blobs[0].Data
					}
				}
			}
		}
	}
	if err := b.claimHead(ctx); err != nil {
		b.cancel()
		return nil, err
	}
	b.mu.Lock()
	b.mu.base = base
	b.setVersionLocked(b.buildVersionLocked(base))
	b.mu.Unlock()
	b.cnt.segments.Store(int64(len(base.Segs)))
	b.cnt.hotLimit.Store(b.member.limit.Load())

	b.wg.Add(1)
	go b.maintain()
	if s.cfg.prefetchIndexes && len(base.Segs) > 0 {
		b.wg.Add(1)
		go b.prefetch(b.version.Load())
	}
	return b, nil
}

// setVersionLocked publishes v as the version cold reads use.
func (b *Tiered) setVersionLocked(v *version) {
	b.version.Store(v)
	b.countIndexes(v)
}

// countIndexes sets indexBytes from the loaded metas of v, the newest version (a meta that
// loads later counts it again). A meta holds its encoded bytes (which its keys and filter
// alias) and a handle per block.
func (b *Tiered) countIndexes(v *version) {
	var n int64
	for _, s := range v.segs {
		if m := s.meta.Load(); m != nil {
			n += s.ref.MetaLen + int64(len(m.Blocks))*blockHandleBytes
		}
	}
	for _, g := range v.gens {
		n += int64(g.Bytes())
	}
	if b.version.Load() == v {
		b.indexBytes.Store(n)
	}
}

// blockHandleBytes is what a loaded block handle costs besides its key bytes.
const blockHandleBytes = 48

// buildVersionLocked makes the version of manifest m, reusing loaded segment metas.
func (b *Tiered) buildVersionLocked(m *format.Manifest) *version {
	n := len(b.mu.mem) + len(b.mu.spills) + len(m.Segs)
	v := &version{segs: make([]*liveSeg, 0, n), covered: make([]bool, b.numKG)}
	live := make(map[string]*liveSeg, n)
	mem := make(map[string][]byte, len(b.mu.mem))
	refs := make([]format.SegRef, 0, n)
	for _, ms := range b.mu.mem {
		refs = append(refs, ms.ref)
		mem[ms.ref.Name] = ms.data
	}
	for _, r := range slices.Concat(refs, b.mu.spills, m.Segs) {
		ls := b.mu.live[r.Name]
		data := mem[r.Name]
		if ls == nil || ls.ref.Use != r.Use || (ls.mem == nil) != (data == nil) {
			n := &liveSeg{ref: r, object: b.root + r.Name, mem: data}
			if ls != nil {
				n.meta.Store(ls.meta.Load())
			} else if m := b.mu.written[r.Name]; m != nil {
				n.meta.Store(m)
			}
			ls = n
		}
		live[r.Name] = ls
		v.segs = append(v.segs, ls)
		for kg := max(r.Use.Lo, r.KGLo); kg < r.Use.Hi && kg <= r.KGHi; kg++ {
			v.covered[kg] = true
		}
	}
	for name := range b.mu.written {
		if live[name] != nil {
			delete(b.mu.written, name)
		}
	}
	b.mu.live = live
	b.versionGensLocked(v)
	return v
}

const maxWrittenMetas = 256

// wrote records the meta of a segment just written (see mu.written).
func (b *Tiered) wrote(name string, data []byte, info format.SegInfo) {
	// A copy: the meta's keys and filter alias what it is decoded from, which is the whole
	// segment here.
	raw := bytes.Clone(data[info.MetaOff : info.MetaOff+info.MetaLen])
	m, err := format.DecodeSegMeta(b.root+name, raw, info.MetaOff)
	if err != nil {
		return // a read will load and verify it from the pool
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.written == nil || len(b.mu.written) >= maxWrittenMetas {
		b.mu.written = map[string]*format.SegMeta{}
	}
	b.mu.written[name] = m
}

// Open implements Backend.
func (b *Tiered) Open(names []string) error {
	if len(names) > 1<<16 {
		return fmt.Errorf("state: too many states")
	}
	b.run.names = append([]string(nil), names...)
	return nil
}

func (b *Tiered) stateName(id StateID) string {
	if int(id) < len(b.run.names) {
		return b.run.names[id]
	}
	return fmt.Sprintf("#%d", id)
}

// poll applies the outcome of finished snapshots: committed keys become clean (evictable), the
// keys of failed ones become dirty again so the next Capture retries them. Cheap when nothing
// finished: one atomic load.
func (b *Tiered) poll() {
	ev := b.events.Load()
	if ev == b.run.seenEvents {
		return
	}
	b.run.seenEvents = ev
	b.observe()
}

// observe applies what the pending snapshots' persists did. A delta readable from its
// encoded segments (in memory until durable) no longer needs its entries hot: its list of
// entries joins the LRU list whole, in O(1), and what it pins is its segments' bytes from then
// on. Then the outcomes, in capture order: a committed delta's segments leave memory; a failed
// one's entries are dirty again, in the current generation, if it failed before it was
// readable (so the next Capture retries them), or its segments stay in memory, carried by the
// next delta to persist (see Tiered.mu.mem).
func (b *Tiered) observe() {
	for _, s := range b.run.pending {
		if !s.readSeen && s.isReadable() {
			b.sawReadable(s)
		}
	}
	for len(b.run.pending) > 0 {
		s := b.run.pending[0]
		if !s.finished() {
			break
		}
		if !s.readSeen && s.isReadable() {
			b.sawReadable(s)
		}
		b.run.pending[0] = nil
		b.run.pending = b.run.pending[1:]
		b.run.settled = s.seq
		if i := slices.Index(b.run.readable, s.seq); i >= 0 {
			b.run.readable = slices.Delete(b.run.readable, i, i+1)
		}
		switch {
		case !s.readSeen:
			b.run.pinnedOut -= s.pinnedBytes
			if s.err == nil {
				listSpliceFront(&b.run.lru, &s.list) // an empty delta
			}
			for s.list.next != &s.list {
				e := s.list.next
				listRemove(e)
				b.redirty(e)
			}
		case s.err == nil:
			freed := s.memBytes + s.carriedBytes
			b.run.pinnedOut -= freed
			b.run.memBytes -= freed
		}
		// A failed readable delta's segments, and what it carried, stay in memory and pinned:
		// the delta that takes them frees them with its own.
		s.ents = nil
	}
	b.maybeEvict()
}

// sawReadable applies a delta's readable: its entries are clean from now on.
func (b *Tiered) sawReadable(s *snapshot) {
	s.readSeen = true
	b.run.pinnedOut += s.memBytes - s.pinnedBytes
	b.run.memBytes += s.memBytes
	b.run.readable = append(b.run.readable, s.seq)
	listSpliceFront(&b.run.lru, &s.list)
}

// redirty makes e, whose delta failed (so its cell is settled), dirty in the current
// generation with the same value.
func (b *Tiered) redirty(e *entry) {
	c := e.c.Load()
	c.gen = b.run.captureSeq + 1
	c.prev.Store(nil)
	listPushFront(&b.run.gen, e)
	b.run.dirty = append(b.run.dirty, e)
	b.run.dirtyBytes += e.size
}

// clean reports whether e is clean: durable in a committed checkpoint or spill (or filled
// from the durable tier), so evictable once no record holds it.
func (b *Tiered) clean(e *entry) bool { return b.free(e.c.Load().gen) }

// free reports whether the cells of generation gen are read by no persist, and its entries
// clean: its delta's outcome was observed, or it was seen readable.
func (b *Tiered) free(gen uint64) bool {
	return gen <= b.run.settled || len(b.run.readable) > 0 && slices.Contains(b.run.readable, gen)
}

func (b *Tiered) lruPush(e *entry) { listPushFront(&b.run.lru, e) }

func listPushFront(head, e *entry) {
	e.prev, e.next = head, head.next
	head.next.prev = e
	head.next = e
	e.linked = true
}

func listRemove(e *entry) {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next, e.linked = nil, nil, false
}

// listMove moves the entries of list src to the empty list dst, in O(1).
func listMove(dst, src *entry) {
	if src.next == src {
		dst.next, dst.prev = dst, dst
		return
	}
	dst.next, dst.prev = src.next, src.prev
	dst.next.prev, dst.prev.next = dst, dst
	src.next, src.prev = src, src
}

// listSpliceFront moves the entries of list src to the front of list dst, in O(1).
func listSpliceFront(dst, src *entry) {
	if src.next == src {
		return
	}
	first, last := src.next, src.prev
	last.next = dst.next
	dst.next.prev = last
	dst.next = first
	first.prev = dst
	src.next, src.prev = src, src
}

// maybeEvict evicts clean entries from the tail of the LRU list until the tier fits its
// budget. Only clean entries are ever in the LRU list, so every step is productive but for a
// held entry, which leaves the list (its Release puts it back): a write burst of dirty keys
// costs O(1) per write, never a scan past pinned entries.
//
// The eviction is frequency-aware (a GCLOCK over the LRU order): an entry at the tail that was
// hit while hot (freq > 0) is spared once per hit bit, going back to the front with its count
// halved, and the first entry at the tail with a count of 0 is evicted. Plain LRU loses a Zipf
// head to bursts: a delta made readable splices all its entries (mostly keys written once) to
// the front at once, and while the runner waits (at the in-flight cap, in a barrier drain) no
// hit refreshes the head, so the burst pushes it out; each such key is then fetched again
// while hundreds of its records park behind it (issue 10). Spared entries cost O(1) each, paid
// for by the hits that counted them (at most log2(maxFreq)+1 sparings per entry between hits),
// and a call spares at most maxSpared plus 4 per eviction, so it stays short.
func (b *Tiered) maybeEvict() {
	limit := b.member.limit.Load()
	head := &b.run.lru
	index := b.indexBytes.Load()
	spared, evicted := 0, 0
	for limit > 0 && b.run.bytes+b.run.memBytes+index > limit && head.prev != head {
		e := head.prev
		// INVARIANT: only clean entries are in the LRU list.
		if !b.clean(e) {
			panic("state: dirty or pinned entry in LRU list")
		}
		listRemove(e)
		if e.holds > 0 {
			continue
		}
		if e.freq > 0 && !b.plainLRU && spared < maxSpared+4*evicted {
			// A second chance for an entry hit while hot: back to the front, with half its
			// count (see maxFreq).
			e.freq >>= 1
			b.lruPush(e)
			spared++
			continue
		}
		evicted++
		delete(b.run.hot, e.key)
		if b.run.last == e {
			b.run.last = nil
		}
		b.run.bytes -= e.size
		b.cnt.evictions.Add(1)
		if e.written {
			b.run.guard.record(format.Hash64([]byte(e.key)))
		}
	}
	used := b.run.bytes + b.run.memBytes + index
	over := int64(0)
	if limit > 0 && used > limit {
		over = used - limit
	}
	b.member.usage.Store(used)
	b.cnt.hotBytes.Store(used)
	b.cnt.hotLimit.Store(limit)
	b.cnt.hotOverflow.Store(over)
	b.cnt.hotEntries.Store(int64(len(b.run.hot)))
	b.cnt.memSegBytes.Store(b.run.memBytes)
	b.cnt.indexBytes.Store(index)
}

// maxFreq is the highest hit count an entry keeps (see maybeEvict): 2 bits. A larger one
// keeps a former head key hot for longer after it cools, and gains nothing on a Zipf trace.
// maxSpared bounds the entries one maybeEvict spares beyond 4 per eviction.
const (
	maxFreq   = 3
	maxSpared = 64
)

// Get implements Backend.
func (b *Tiered) Get(k Key) ([]byte, bool, bool) {
	b.poll()
	b.run.scratch = AppendKey(b.run.scratch[:0], k)
	if e, ok := b.find(b.run.scratch); ok {
		b.cnt.hits.Add(1)
		if e.freq < maxFreq {
			e.freq++
		}
		c := e.c.Load()
		if e.linked && b.run.lru.next != e && b.free(c.gen) {
			listRemove(e)
			b.lruPush(e)
		}
		if c.tomb {
			return nil, false, true
		}
		return c.value, true, true
	}
	if !b.mayBeDurable(k) {
		b.cnt.hits.Add(1)
		return nil, false, true
	}
	b.cnt.misses.Add(1)
	return nil, false, false
}

// mayBeDurable reports whether the committed durable tier may hold k: false when no segment
// covers its key group, or every candidate segment's (loaded) bloom filter rules it out.
//
// Any segment that may hold k answers it, so they are asked in the order most likely to end
// early: first those without a filter generation, oldest first, for a compaction's output
// holds most keys of a subtask's durable tier: a key there (most misses of a tier that holds
// a fraction of its keys, issue 10) is answered by one filter, not after the negative probes
// of every newer segment's. Then the generations' members, skipping the segments of a
// generation that rules k out.
func (b *Tiered) mayBeDurable(k Key) bool {
	v := b.version.Load()
	if len(v.segs) == 0 {
		return false
	}
	kg := KeyGroupOf(k.Record, b.numKG)
	if !v.covered[kg] {
		return false
	}
	b.run.dkey = format.AppendDurableKey(b.run.dkey[:0], kg, b.stateName(k.State), k.Record, k.Entry)
	dk := b.run.dkey
	h := format.Hash64(dk)
	mayHold := func(s *liveSeg) bool {
		if !s.ref.Use.Contains(kg) || bytes.Compare(dk, s.ref.MinKey) < 0 || bytes.Compare(dk, s.ref.MaxKey) > 0 {
			return false
		}
		m := s.meta.Load()
		return m == nil || m.Bloom.MayContain(h)
	}
	for i := len(v.segs) - 1; i >= 0; i-- {
		if (v.segGen == nil || v.segGen[i] < 0) && mayHold(v.segs[i]) {
			return true
		}
	}
	if len(v.gens) == 0 {
		return false
	}
	var no uint8 // bit j: generation j's filter rules the key out, for all its segments at once
	for j := range v.gens {
		if !v.gens[j].MayContain(h) {
			no |= 1 << j
		}
	}
	for i, s := range v.segs {
		if g := v.segGen[i]; g >= 0 && no&(1<<g) == 0 && mayHold(s) {
			return true
		}
	}
	return false
}

// find returns the hot entry of the AppendKey encoding k, trying the last one found first.
func (b *Tiered) find(k []byte) (*entry, bool) {
	if e := b.run.last; e != nil && e.key == string(k) {
		return e, true
	}
	e, ok := b.run.hot[string(k)]
	if ok {
		b.run.last = e
	}
	return e, ok
}

// Hold keeps k's entry hot until Release, if it is hot now (it reports whether it is): the
// scheduler holds a record's prefetched values from their load until its call has run, so a
// burst of other fills cannot evict them in between (which would make the call read them
// again, cold, inside the guest). Eviction takes only entries no record holds; held bytes
// count against the budget like any other, so a tier whose budget is smaller than what the
// admitted records hold goes over it by at most that much.
func (b *Tiered) Hold(k Key) bool {
	b.run.scratch = AppendKey(b.run.scratch[:0], k)
	e, ok := b.find(b.run.scratch)
	if !ok {
		return false
	}
	e.holds++
	if e.linked && b.clean(e) {
		listRemove(e)
	}
	return true
}

// Release ends one Hold of k.
func (b *Tiered) Release(k Key) {
	b.run.scratch = AppendKey(b.run.scratch[:0], k)
	e, ok := b.find(b.run.scratch)
	if !ok || e.holds == 0 {
		return
	}
	if e.holds--; e.holds == 0 && !e.linked && b.clean(e) {
		b.lruPush(e)
		b.maybeEvict()
	}
}

// Put implements Backend.
func (b *Tiered) Put(k Key, value []byte) {
	b.poll()
	e, c := b.writeEntry(k)
	c.set(value)
	c.tomb = false
	b.account(e, c)
}

// Delete implements Backend.
func (b *Tiered) Delete(k Key) {
	b.poll()
	b.run.scratch = AppendKey(b.run.scratch[:0], k)
	if _, ok := b.find(b.run.scratch); !ok && !b.mayBeDurable(k) {
		return // nothing to delete anywhere
	}
	e, c := b.writeEntry(k)
	c.value, c.tomb = nil, true
	b.account(e, c)
}

// writeEntry returns k's entry, creating it, dirty (in the current generation's list), and
// the cell of the current generation, which the caller writes in place.
func (b *Tiered) writeEntry(k Key) (*entry, *cell) {
	gen := b.run.captureSeq + 1
	b.run.scratch = AppendKey(b.run.scratch[:0], k)
	e, ok := b.find(b.run.scratch)
	if !ok {
		e = newEntry(b.run.scratch)
		e.written = true
		e.own.gen = gen
		e.c.Store(&e.own)
		b.run.hot[e.key] = e
		b.run.last = e
		listPushFront(&b.run.gen, e)
		b.run.dirty = append(b.run.dirty, e)
		return e, &e.own
	}
	e.written = true
	b.run.bytes -= e.size
	c := e.c.Load()
	if c.gen == gen {
		b.run.dirtyBytes -= e.size
		return e, c
	}
	// The first write of this generation.
	if e.linked {
		listRemove(e)
	}
	switch {
	case b.free(c.gen):
		// No persist reads c: write it in place (the common case).
		c.gen = gen
		c.prev.Store(nil)
	case c != &e.own && b.free(e.own.gen) && (c.prev.Load() == nil || c.prev.Load() == &e.own):
		// c is captured and pending, own is free: c's value stays as the snapshot saw it.
		c.prev.Store(nil)
		o := &e.own
		o.gen, o.tomb = gen, c.tomb // own's buffer is free: Put may write it in place
		o.prev.Store(c)
		e.c.Store(o)
		c = o
	default:
		n := &cell{gen: gen, tomb: c.tomb}
		n.prev.Store(c)
		e.c.Store(n)
		c = n
	}
	listPushFront(&b.run.gen, e)
	b.run.dirty = append(b.run.dirty, e)
	return e, c
}

// account adds the new size of e, just written (so dirty), and keeps the tier in its budget.
func (b *Tiered) account(e *entry, c *cell) {
	e.size = int64(len(e.key)+len(c.value)) + entryOverhead
	b.run.bytes += e.size
	b.run.dirtyBytes += e.size
	if limit := b.member.limit.Load(); limit > 0 {
		if b.run.dirtyBytes >= limit/spillFraction {
			b.spill()
		} else if b.run.pinnedOut+b.run.dirtyBytes > limit {
			b.waitPinned()
		}
	}
	b.maybeEvict()
}

// spillFraction: the dirty entries are spilled when they reach this fraction of the budget.
// Up to spillFraction-1 deltas can then persist at once while the next one fills.
const spillFraction = 3

// spill keeps dirty data within the hot budget: without it a run that writes more distinct
// keys than the tier holds would keep every one in memory until the next checkpoint (dirty
// entries cannot be evicted), and the runner itself is what writes them, so backpressure could
// not help. When the dirty entries reach a third of the budget, they are written to the pool
// as a segment that belongs to no checkpoint yet (ForSt flushes its memtables the same way).
// Once it is written the version that cold reads use includes it, so the entries are clean and
// can be evicted like committed ones; the next checkpoint's manifest adopts the segment, so
// restoring that checkpoint gives exactly the state a checkpoint of the unspilled tier would.
// A crash before that leaves an unreferenced segment, which garbage collection removes.
//
// Bounds: dirty bytes stay under a third of the budget, and the deltas in flight (spilled or
// captured) plus the dirty entries never exceed the budget: a write that would take them
// over it waits in waitPinned for the oldest delta to become readable or durable. A capture
// itself waits only while they are over (it moves bytes from dirty to pinned, and adds none):
// it waited before for room for the whole next delta, which made nearly every spill wait for
// the encode of the one before it (issue 10: 90-250 ms of a 1 s run at a tenth hot, most
// waits 1-9 ms of goroutine scheduling for 0.25 ms of encoding), while the next delta's
// writes gave that encode time enough.
// Deltas write their segments in parallel (only their commits are ordered), so on a remote pool
// with a latency of L the runner spills up to two deltas per L before it waits: it waited
// for every spill's write before (issue 10: about half the run's wall time).
func (b *Tiered) spill() {
	if b.ctx.Err() != nil {
		return // closed: Capture fails too, and nothing will read what a spill would write
	}
	s := b.captureDelta(0, true)
	b.cnt.spills.Add(1)
	s.startChain(b.ctx) // its outcome is observed by poll
}

// Fetch implements Backend. The keys are encoded on the runner; the reads run off it, in a
// lookup against the newest committed version, together with the other Fetches that queued
// while maxLookups lookups were running (see lookups).
func (b *Tiered) Fetch(keys []Key, done func([]Fetched, error)) {
	b.poll()
	if b.ctx.Err() != nil {
		go done(nil, ErrClosed)
		return
	}
	stamp := b.run.guard.stamp()
	out := make([]Fetched, len(keys))
	reqs := make([]fetchReq, len(keys))
	size := 0
	for _, k := range keys {
		size += len(k.Record) + len(k.Entry)
	}
	buf := make([]byte, 0, size)
	// The durable keys share one buffer too: a key group, the state's name and two lengths
	// beside the key's bytes.
	var dks []byte
	for i, k := range keys {
		off := len(buf)
		buf = append(buf, k.Record...)
		rec := buf[off:len(buf):len(buf)]
		buf = append(buf, k.Entry...)
		ent := buf[off+len(k.Record) : len(buf) : len(buf)]
		out[i] = Fetched{Key: Key{State: k.State, Record: rec, Entry: ent}, gen: stamp}
		kg := KeyGroupOf(k.Record, b.numKG)
		name := b.stateName(k.State)
		if n := format.DurableKeyLen(name, k.Record, k.Entry); cap(dks)-len(dks) < n {
			// Room for the rest at this key's size (one more buffer if a later one is longer).
			dks = make([]byte, 0, (len(keys)-i)*n)
		}
		off = len(dks)
		dks = format.AppendDurableKey(dks, kg, name, k.Record, k.Entry)
		dk := dks[off:len(dks):len(dks)]
		reqs[i] = fetchReq{idx: i, kg: kg, dk: dk, h: format.Hash64(dk)}
	}
	b.cnt.fetchKeys.Add(int64(len(keys)))
	b.cnt.fetchOut.Add(int64(len(keys)))
	j := &fetchJob{reqs: reqs, out: out, done: done}
	b.fq.Lock()
	if b.fq.running >= maxLookups {
		b.fq.queue = append(b.fq.queue, j)
		b.fq.Unlock()
		return
	}
	b.fq.running++
	b.fq.Unlock()
	go b.lookups([]*fetchJob{j})
}

// maxLookups bounds the lookups of a backend in flight. Fetches issued while that many run
// wait, and the next lookup to start takes all of them at once: under load the keys of many
// Fetches share each block read (and each ranged GET), which is what makes a miss cheap on a
// pool whose requests cost CPU and latency rather than bytes, and under light load a Fetch
// starts at once. One lookup at a time: a lookup's GETs are one round in parallel, so one keeps
// the pool busy, and the Fetches queued meanwhile share the next one's GETs. A second lookup
// beside it costs GETs (each lookup reads every segment its keys are in: the GETs of a lookup
// are about the segments it touches, whatever its keys), and on a machine whose CPU the S3
// requests bound (issue 10's benchmark: versitygw ~1 ms a request, this process ~0.2 ms) a GET
// costs more than the wait. Issue 10, session 11, two sets of 4 alternating runs of the long
// cases: two lookups against one made 1.5-2.0x the GETs (Zipf a tenth hot 0.00102-0.00127
// against 0.00065-0.00068 a record, uniform a third 0.00150-0.00155 against 0.00092-0.00098)
// and 1.05-1.18x this process's CPU a record, at a lower rate. What one costs is the wait of a
// Fetch issued while a lookup runs, up to that lookup's slowest GET: the share of the
// Little's-law bound was 0.29-0.30 against 0.30-0.36 (Zipf), 0.43-0.47 against 0.47-0.48.
// Sessions 6 and 8 measured 8, 4 and 2 (4 made 1.5-1.6x the GETs of 2).
const maxLookups = 1

// fetchJob is one Fetch waiting for, or in, a lookup.
type fetchJob struct {
	reqs []fetchReq
	out  []Fetched
	done func([]Fetched, error)
}

// lookups runs jobs as one lookup, then whatever queued meanwhile, until nothing is queued.
//
// A lookup reads the newest committed version, which may be newer than the one current when
// a job's Fetch was issued: that is as correct (a newer version only adds commits, and every
// key it answers for is at least as new), and the version INVARIANT still holds, since it
// asks only that a Fetch issued after a commit reads a version that has it.
func (b *Tiered) lookups(jobs []*fetchJob) {
	for {
		b.lookupJobs(jobs)
		b.fq.Lock()
		jobs, b.fq.queue = b.fq.queue, nil
		if len(jobs) == 0 {
			b.fq.running--
			b.fq.Unlock()
			return
		}
		b.fq.Unlock()
	}
}

func (b *Tiered) lookupJobs(jobs []*fetchJob) {
	v := b.version.Load()
	reqs, out := jobs[0].reqs, jobs[0].out
	var jobOf []int32 // per merged request idx: its job (nil: one job)
	var offs []int    // per job: where its results start in out
	if len(jobs) > 1 {
		n := 0
		for _, j := range jobs {
			n += len(j.reqs)
		}
		reqs, out = make([]fetchReq, 0, n), make([]Fetched, 0, n)
		jobOf, offs = make([]int32, 0, n), make([]int, len(jobs))
		for ji, j := range jobs {
			offs[ji] = len(out)
			for _, r := range j.reqs {
				r.idx += len(out)
				reqs = append(reqs, r)
			}
			out = append(out, j.out...)
			for range j.out {
				jobOf = append(jobOf, int32(ji))
			}
		}
	}
	b.cnt.lookups.Add(1)
	b.cnt.lookupKeys.Add(int64(len(reqs)))
	b.cnt.lookupsRun.Add(1)
	b.cnt.lookupKeysRun.Add(int64(len(reqs)))
	// Each job completes as soon as its own keys are resolved (see lookup).
	left := make([]int, len(jobs))
	for ji, j := range jobs {
		left[ji] = len(j.reqs)
	}
	answer := func(ji int) {
		j := jobs[ji]
		left[ji] = -1
		if jobOf != nil {
			copy(j.out, out[offs[ji]:offs[ji]+len(j.out)])
		}
		found := 0
		for i := range j.out {
			if j.out[i].Found {
				found++
			}
		}
		b.cnt.fetchFound.Add(int64(found))
		b.cnt.fetchOut.Add(-int64(len(j.reqs)))
		j.done(j.out, nil)
	}
	err := b.lookup(b.ctx, v, reqs, out, func(idx int) {
		ji := 0
		if jobOf != nil {
			ji = int(jobOf[idx])
		}
		if left[ji]--; left[ji] == 0 {
			answer(ji)
		}
	})
	b.cnt.lookupsRun.Add(-1)
	b.cnt.lookupKeysRun.Add(-int64(len(reqs)))
	for ji, j := range jobs {
		switch {
		case left[ji] < 0: // answered
		case left[ji] == 0: // a Fetch of no keys
			answer(ji)
		default:
			if err == nil {
				err = fmt.Errorf("state: lookup of %d keys ended with %d of a Fetch unresolved", len(reqs), left[ji])
			}
			b.cnt.fetchOut.Add(-int64(len(j.reqs)))
			j.done(nil, err)
		}
	}
}

// Fill implements Backend. A result is installed only when the key has no hot entry (a local
// write, newer than any fetch, wins) and no write of it was evicted since the fetch began.
func (b *Tiered) Fill(results []Fetched) {
	b.poll()
	for i := range results {
		r := &results[i]
		b.run.scratch = AppendKey(b.run.scratch[:0], r.Key)
		if _, ok := b.run.hot[string(b.run.scratch)]; ok {
			continue
		}
		if !b.run.guard.allow(r.gen, format.Hash64(b.run.scratch)) {
			b.cnt.fillsDenied.Add(1)
			continue
		}
		e := b.newFilled(r)
		b.lruPush(e)
	}
	b.maybeEvict()
}

// newFilled installs the hot entry of a fetched result (the key in b.run.scratch), clean and
// in no list.
func (b *Tiered) newFilled(r *Fetched) *entry {
	e := newEntry(b.run.scratch)
	e.own.tomb = !r.Found
	if r.Found {
		e.own.set(r.Value)
	}
	e.c.Store(&e.own)
	e.size = int64(len(e.key)+len(e.own.value)) + entryOverhead
	b.run.hot[e.key] = e
	b.run.bytes += e.size
	b.cnt.fills.Add(1)
	return e
}

// FillHold implements Holder.
func (b *Tiered) FillHold(results []Fetched, hold []bool) {
	b.poll()
	for i := range results {
		r := &results[i]
		b.run.scratch = AppendKey(b.run.scratch[:0], r.Key)
		e, ok := b.run.hot[string(b.run.scratch)]
		if !ok {
			e = b.newFilled(r)
			if i >= len(hold) || !hold[i] {
				b.lruPush(e)
			}
		} else if i < len(hold) && hold[i] && e.linked && b.clean(e) {
			listRemove(e)
		}
		if i < len(hold) && hold[i] {
			e.holds++
		}
	}
	b.maybeEvict()
}

// SetOperatorState implements Backend.
func (b *Tiered) SetOperatorState(name string, data []byte) {
	b.run.opState[name] = append([]byte(nil), data...)
}

// OperatorState implements Backend. After a restore at a different parallelism, where several
// old subtasks' blobs apply, it returns nil: use RestoredOperatorState.
func (b *Tiered) OperatorState(name string) []byte { return b.run.opState[name] }

// RestoredOperatorState returns the blobs named name of every restored subtask whose key groups
// overlap this one's, with the range each came from (runner side).
func (b *Tiered) RestoredOperatorState(name string) []RangeBlob { return b.run.restoredOp[name] }

// KeyGroups returns the key groups this backend owns.
func (b *Tiered) KeyGroups() KeyGroupRange { return b.rng }

// NumKeyGroups returns the operator's number of key groups.
func (b *Tiered) NumKeyGroups() int { return b.numKG }

// Capture implements Backend: it ends the current generation, whose entries (the delta since
// the last capture) stay pinned until its persist has made them readable from its encoded
// segments, and returns a Snapshot whose Persist commits it. O(1): no entry is visited or
// copied on the runner (see entry).
func (b *Tiered) Capture(checkpointID uint64) (Snapshot, error) {
	return b.capture(checkpointID, false)
}

// CaptureSavepoint is Capture for a savepoint: the checkpoint is never garbage-collected.
func (b *Tiered) CaptureSavepoint(checkpointID uint64) (Snapshot, error) {
	return b.capture(checkpointID, true)
}

// Savepointer is implemented by backends that can take savepoints (checkpoints that are never
// garbage-collected).
type Savepointer interface {
	CaptureSavepoint(checkpointID uint64) (Snapshot, error)
}

var _ Savepointer = (*Tiered)(nil)

func (b *Tiered) capture(id uint64, savepoint bool) (Snapshot, error) {
	b.poll()
	if b.ctx.Err() != nil {
		return nil, ErrClosed
	}
	if id == 0 || id == RestoreLatest {
		return nil, fmt.Errorf("state: bad checkpoint id %d", id)
	}
	s := b.captureDelta(id, false)
	s.savepoint = savepoint
	return s, nil
}

// waitPinned keeps what pending snapshots pin, plus the dirty entries, within the hot budget:
// checkpoints captured faster than they persist (every 100 ms on a slow pool) would otherwise
// pin one delta each, none evictable, until their persists catch up. It starts the pending
// snapshots' persists (a second start of one already running does nothing) and waits for the
// oldest until the rest fit: backpressure on the runner, as long as the pool takes to make
// readable, or commit, what is already captured.
func (b *Tiered) waitPinned() {
	limit := b.member.limit.Load()
	for limit > 0 && len(b.run.pending) > 0 && b.run.pinnedOut+b.run.dirtyBytes > limit && b.ctx.Err() == nil {
		oldest := b.run.pending[0]
		b.run.pending[len(b.run.pending)-1].startChain(b.ctx) // observed below and by poll
		// The next to become readable frees its entries' bytes for its segments' (smaller)
		// ones, so waiting for it is enough to go on, well before the PUTs end.
		readable := make(chan struct{}) // never closed: every pending one was seen readable
		for _, s := range b.run.pending {
			if !s.readSeen {
				readable = s.readable
				break
			}
		}
		t := time.Now()
		select {
		case <-oldest.done:
		case <-readable:
		}
		b.cnt.backpressureNanos.Add(int64(time.Since(t)))
		b.observe()
	}
}

// captureDelta ends the current generation: its entries (and the operator state) become a
// snapshot that builds on the pending ones. O(1) in the number of dirty entries: this is the
// runner's pause at a checkpoint, and the persist reads each entry's value of the generation
// off the runner (see entry).
func (b *Tiered) captureDelta(id uint64, spill bool) *snapshot {
	b.waitPinned()
	b.run.captureSeq++
	s := &snapshot{b: b, id: id, seq: b.run.captureSeq, spill: spill, names: b.run.names, done: make(chan struct{}), encoded: make(chan struct{}), readable: make(chan struct{})}
	s.ents = b.run.dirty
	listMove(&s.list, &b.run.gen)
	s.pinnedBytes = b.run.dirtyBytes
	s.estimate = b.run.dirtyBytes - int64(len(s.ents))*entryOverhead
	b.run.pinnedOut += s.pinnedBytes
	b.run.dirty = make([]*entry, 0, min(len(s.ents), 1024))
	b.run.dirtyBytes = 0
	for name, data := range b.run.opState {
		s.opState = append(s.opState, format.NamedBlob{Name: name, Data: data}) // SetOperatorState copies
	}
	sort.Slice(s.opState, func(i, j int) bool { return s.opState[i].Name < s.opState[j].Name })
	s.bytes.Store(s.estimate)
	// The new snapshot builds on the newest one whose outcome the runner has not observed yet:
	// if that one fails, this one must fail too (its keys were not re-dirtied in time). Once
	// the runner has observed every outcome, failed keys are dirty again and committed ones
	// are in the base manifest, so the snapshot stands alone.
	b.mu.Lock()
	if n := len(b.run.pending); n > 0 {
		s.prev = b.run.pending[n-1]
	}
	b.mu.Unlock()
	b.run.pending = append(b.run.pending, s)
	return s
}

// Metrics returns this backend's metrics, with the remote request counters of its Store's pool
// (shared by the Store's backends).
func (b *Tiered) Metrics() Metrics {
	m := b.cnt.snapshot()
	b.s.remoteInto(&m)
	m.ratios()
	return m
}

// Close implements Backend. Snapshots still persisting fail with ErrClosed.
func (b *Tiered) Close() error {
	b.mu.Lock()
	if b.mu.closed {
		b.mu.Unlock()
		return nil
	}
	b.mu.closed = true
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
	b.persists.Wait()
	b.s.forget(b)
	return nil
}

// parseHotKey splits an AppendKey encoding.
func parseHotKey(k string) (StateID, []byte, []byte) {
	id := StateID(binary.BigEndian.Uint16([]byte(k[:2])))
	rest := []byte(k[2:])
	n, w := binary.Uvarint(rest)
	return id, rest[w : w+int(n)], rest[w+int(n):]
}

// fillGuard tells Fill whether a fetched result may be stale: a result is stale if a key
// written locally was committed and evicted after the fetch was issued (the fetch may have read
// an older version). It remembers the hashes of the last guardRing such evictions; a fetch
// older than that window is conservatively refused (the caller fetches again).
type fillGuard struct {
	seq  uint64 // evictions of written keys so far
	ring [guardRing]struct{ h, seq uint64 }
	last map[uint64]uint64 // hash -> latest eviction seq
}

const guardRing = 4096

func (g *fillGuard) init() { g.last = map[uint64]uint64{} }

// stamp is taken when a fetch is issued; 0 is reserved for results not made by Fetch.
func (g *fillGuard) stamp() uint64 { return g.seq + 1 }

func (g *fillGuard) record(h uint64) {
	g.seq++
	slot := &g.ring[g.seq%guardRing]
	if slot.seq != 0 && g.last[slot.h] == slot.seq {
		delete(g.last, slot.h)
	}
	slot.h, slot.seq = h, g.seq
	g.last[h] = g.seq
}

func (g *fillGuard) allow(stamp, h uint64) bool {
	if stamp == 0 {
		return g.seq == 0
	}
	issued := stamp - 1
	if issued == g.seq {
		return true
	}
	if g.seq-issued >= guardRing {
		return false
	}
	s, ok := g.last[h]
	return !ok || s <= issued
}
