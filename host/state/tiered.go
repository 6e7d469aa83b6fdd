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

	"github.com/clink-wasm/clink-wasm/host/state/internal/format"
)

// entryOverhead is what one hot entry costs beyond its key and value bytes (the entry struct,
// the map slot and the string header), counted in the hot-tier byte accounting.
const entryOverhead = 96

// entry is one key in the hot tier.
type entry struct {
	key   string // AppendKey encoding
	value []byte
	size  int64
	tomb  bool // deleted, or known absent from the durable tier
	// dirty: written since the last Capture. INVARIANT: a dirty entry is never evicted and
	// is in Tiered.run.dirty.
	dirty bool
	// written: changed locally at some point, so the durable tier may hold a newer value than
	// a fetch that started before the change (see fillGuard).
	written bool
	// pin is the capture sequence that last captured this entry. INVARIANT: while pin >
	// run.committed the entry is pinned: it is not evicted (reads during the persist window see
	// it) and its value slice is not written in place (the snapshot references it).
	pin uint64
	// holds counts the records that need this entry before their call runs (Hold). INVARIANT:
	// a held entry is not in the LRU list, so it is never evicted.
	holds      int32
	prev, next *entry // LRU links
	inLRU      bool
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
	events  atomic.Uint64 // bumped when a snapshot finishes; the runner polls it

	// run is runner-owned. INVARIANT: only the runner touches it.
	run struct {
		names      []string
		hot        map[string]*entry
		lru        entry // sentinel: lru.next is most recent. INVARIANT: holds exactly the clean entries
		dirty      []*entry
		bytes      int64
		dirtyBytes int64 // sizes of the dirty entries, a part of bytes
		pinnedOut  int64 // sizes of the entries captured by pending snapshots (pinned)
		captureSeq uint64
		committed  uint64 // highest capture seq whose commit the runner has observed
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
		// written are the metas of segments this backend wrote, decoded from the bytes it
		// put, for buildVersionLocked to install so that no cold read GETs them back.
		// Bounded: cleared past maxWrittenMetas (a read then loads one, as after a restore).
		written map[string]*format.SegMeta
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
}

// liveSeg is a segment in use; its meta (index + bloom) is loaded on first need and shared by
// every version that contains the segment.
type liveSeg struct {
	ref    format.SegRef
	object string
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
	b.version.Store(b.buildVersionLocked(base))
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

// buildVersionLocked makes the version of manifest m, reusing loaded segment metas.
func (b *Tiered) buildVersionLocked(m *format.Manifest) *version {
	n := len(b.mu.spills) + len(m.Segs)
	v := &version{segs: make([]*liveSeg, 0, n), covered: make([]bool, b.numKG)}
	live := make(map[string]*liveSeg, n)
	for _, r := range slices.Concat(b.mu.spills, m.Segs) {
		ls := b.mu.live[r.Name]
		if ls == nil || ls.ref.Use != r.Use {
			n := &liveSeg{ref: r, object: b.root + r.Name}
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

// observe applies the outcomes of the finished snapshots at the front of the pending queue.
func (b *Tiered) observe() {
	for len(b.run.pending) > 0 {
		s := b.run.pending[0]
		if !s.finished() {
			break
		}
		b.run.pending[0] = nil
		b.run.pending = b.run.pending[1:]
		b.run.pinnedOut -= s.pinnedBytes
		if s.err == nil {
			b.run.committed = s.seq
			for _, e := range s.pinned {
				if e.pin == s.seq && !e.dirty && !e.inLRU && e.holds == 0 {
					b.lruPush(e)
				}
			}
		} else {
			for _, e := range s.pinned {
				if e.pin == s.seq && !e.dirty {
					e.dirty = true
					b.run.dirty = append(b.run.dirty, e)
					b.run.dirtyBytes += e.size
				}
			}
		}
		s.pinned = nil
	}
	b.maybeEvict()
}

func (b *Tiered) lruPush(e *entry) {
	head := &b.run.lru
	e.prev, e.next = head, head.next
	head.next.prev = e
	head.next = e
	e.inLRU = true
}

func (b *Tiered) lruRemove(e *entry) {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next, e.inLRU = nil, nil, false
}

// maybeEvict evicts least recently used clean entries until the tier fits its budget. Only
// clean entries are ever in the LRU list, so every step is productive: a write burst of dirty
// keys costs O(1) per write, never a scan past pinned entries.
func (b *Tiered) maybeEvict() {
	limit := b.member.limit.Load()
	head := &b.run.lru
	for limit > 0 && b.run.bytes > limit && head.prev != head {
		e := head.prev
		// INVARIANT: only clean entries are in the LRU list.
		if e.dirty || e.pin > b.run.committed {
			panic("state: dirty or pinned entry in LRU list")
		}
		b.lruRemove(e)
		delete(b.run.hot, e.key)
		b.run.bytes -= e.size
		b.cnt.evictions.Add(1)
		if e.written {
			b.run.guard.record(format.Hash64([]byte(e.key)))
		}
	}
	over := int64(0)
	if limit > 0 && b.run.bytes > limit {
		over = b.run.bytes - limit
	}
	b.member.usage.Store(b.run.bytes)
	b.cnt.hotBytes.Store(b.run.bytes)
	b.cnt.hotLimit.Store(limit)
	b.cnt.hotOverflow.Store(over)
	b.cnt.hotEntries.Store(int64(len(b.run.hot)))
}

// Get implements Backend.
func (b *Tiered) Get(k Key) ([]byte, bool, bool) {
	b.poll()
	b.run.scratch = AppendKey(b.run.scratch[:0], k)
	if e, ok := b.run.hot[string(b.run.scratch)]; ok {
		b.cnt.hits.Add(1)
		if e.inLRU && b.run.lru.next != e {
			b.lruRemove(e)
			b.lruPush(e)
		}
		if e.tomb {
			return nil, false, true
		}
		return e.value, true, true
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
	for _, s := range v.segs {
		if !s.ref.Use.Contains(kg) || bytes.Compare(dk, s.ref.MinKey) < 0 || bytes.Compare(dk, s.ref.MaxKey) > 0 {
			continue
		}
		m := s.meta.Load()
		if m == nil || m.Bloom.MayContain(h) {
			return true
		}
	}
	return false
}

// Hold keeps k's entry hot until Release, if it is hot now (it reports whether it is): the
// scheduler holds a record's prefetched values from their load until its call has run, so a
// burst of other fills cannot evict them in between (which would make the call read them
// again, cold, inside the guest). Eviction takes only entries no record holds; held bytes
// count against the budget like any other, so a tier whose budget is smaller than what the
// admitted records hold goes over it by at most that much.
func (b *Tiered) Hold(k Key) bool {
	b.run.scratch = AppendKey(b.run.scratch[:0], k)
	e, ok := b.run.hot[string(b.run.scratch)]
	if !ok {
		return false
	}
	e.holds++
	if e.inLRU {
		b.lruRemove(e)
	}
	return true
}

// Release ends one Hold of k.
func (b *Tiered) Release(k Key) {
	b.run.scratch = AppendKey(b.run.scratch[:0], k)
	e, ok := b.run.hot[string(b.run.scratch)]
	if !ok || e.holds == 0 {
		return
	}
	if e.holds--; e.holds == 0 && !e.dirty && e.pin <= b.run.committed && !e.inLRU {
		b.lruPush(e)
		b.maybeEvict()
	}
}

// Put implements Backend.
func (b *Tiered) Put(k Key, value []byte) {
	b.poll()
	e := b.writeEntry(k)
	if e.pin > b.run.committed || cap(e.value) < len(value) || e.tomb {
		// A pending snapshot may reference the old slice: never write it in place.
		e.value = append([]byte(nil), value...)
	} else {
		e.value = append(e.value[:0], value...)
	}
	e.tomb = false
	b.account(e)
}

// Delete implements Backend.
func (b *Tiered) Delete(k Key) {
	b.poll()
	b.run.scratch = AppendKey(b.run.scratch[:0], k)
	if _, ok := b.run.hot[string(b.run.scratch)]; !ok && !b.mayBeDurable(k) {
		return // nothing to delete anywhere
	}
	e := b.writeEntry(k)
	e.value, e.tomb = nil, true
	b.account(e)
}

// writeEntry returns k's entry, creating it, marked dirty and out of the LRU list.
func (b *Tiered) writeEntry(k Key) *entry {
	b.run.scratch = AppendKey(b.run.scratch[:0], k)
	e, ok := b.run.hot[string(b.run.scratch)]
	if !ok {
		e = &entry{key: string(b.run.scratch)}
		b.run.hot[e.key] = e
	} else {
		b.run.bytes -= e.size
		if e.dirty {
			b.run.dirtyBytes -= e.size
		}
	}
	if e.inLRU {
		b.lruRemove(e)
	}
	if !e.dirty {
		e.dirty = true
		b.run.dirty = append(b.run.dirty, e)
	}
	e.written = true
	return e
}

// account adds the new size of e, just written (so dirty), and keeps the tier in its budget.
func (b *Tiered) account(e *entry) {
	e.size = int64(len(e.key)+len(e.value)) + entryOverhead
	b.run.bytes += e.size
	b.run.dirtyBytes += e.size
	if limit := b.member.limit.Load(); limit > 0 && b.run.dirtyBytes >= limit/spillFraction {
		b.spill()
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
// captured) pin at most what leaves room for the next one: waitPinned waits for the oldest
// before a capture that would not fit, so pinned plus dirty bytes never exceed the budget.
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
	for i, k := range keys {
		off := len(buf)
		buf = append(buf, k.Record...)
		rec := buf[off:len(buf):len(buf)]
		buf = append(buf, k.Entry...)
		ent := buf[off+len(k.Record) : len(buf) : len(buf)]
		out[i] = Fetched{Key: Key{State: k.State, Record: rec, Entry: ent}, gen: stamp}
		kg := KeyGroupOf(k.Record, b.numKG)
		dk := format.AppendDurableKey(nil, kg, b.stateName(k.State), k.Record, k.Entry)
		reqs[i] = fetchReq{idx: i, kg: kg, dk: dk, h: format.Hash64(dk)}
	}
	b.cnt.fetchKeys.Add(int64(len(keys)))
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
// starts at once. Four lookups of any size keep the pool busy: each is one round of parallel
// GETs.
const maxLookups = 4

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
	if len(jobs) > 1 {
		n := 0
		for _, j := range jobs {
			n += len(j.reqs)
		}
		reqs, out = make([]fetchReq, 0, n), make([]Fetched, 0, n)
		for _, j := range jobs {
			for _, r := range j.reqs {
				r.idx += len(out)
				reqs = append(reqs, r)
			}
			out = append(out, j.out...)
		}
	}
	err := b.lookup(b.ctx, v, reqs, out)
	if err != nil {
		for _, j := range jobs {
			j.done(nil, err)
		}
		return
	}
	found := 0
	for i := range out {
		if out[i].Found {
			found++
		}
	}
	b.cnt.fetchFound.Add(int64(found))
	off := 0
	for _, j := range jobs {
		if len(jobs) > 1 {
			copy(j.out, out[off:off+len(j.out)])
		}
		off += len(j.out)
		j.done(j.out, nil)
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
		e := &entry{key: string(b.run.scratch), tomb: !r.Found}
		if r.Found {
			e.value = append([]byte(nil), r.Value...)
		}
		e.size = int64(len(e.key)+len(e.value)) + entryOverhead
		b.run.hot[e.key] = e
		b.run.bytes += e.size
		b.lruPush(e)
		b.cnt.fills.Add(1)
	}
	b.maybeEvict()
}

// FillHold implements Holder.
func (b *Tiered) FillHold(results []Fetched, hold []bool) {
	b.poll()
	for i := range results {
		r := &results[i]
		b.run.scratch = AppendKey(b.run.scratch[:0], r.Key)
		e, ok := b.run.hot[string(b.run.scratch)]
		if !ok {
			e = &entry{key: string(b.run.scratch), tomb: !r.Found}
			if r.Found {
				e.value = append([]byte(nil), r.Value...)
			}
			e.size = int64(len(e.key)+len(e.value)) + entryOverhead
			b.run.hot[e.key] = e
			b.run.bytes += e.size
			b.cnt.fills.Add(1)
			if i >= len(hold) || !hold[i] {
				b.lruPush(e)
			}
		} else if i < len(hold) && hold[i] && e.inLRU {
			b.lruRemove(e)
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

// Capture implements Backend: it detaches the delta since the last capture, pins its keys
// and returns a Snapshot whose Persist commits it. O(dirty keys), no copying of values.
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

// waitPinned keeps what pending snapshots pin, plus the dirty entries, within the hot budget,
// with room left for the next spill's dirty bytes: checkpoints captured faster than they
// persist (every 100 ms on a slow pool) would otherwise pin one delta each, none evictable,
// until their persists catch up. It starts the pending snapshots' persists (a second start of
// one already running does nothing) and waits for the oldest until the rest fit: backpressure
// on the runner, as long as the pool takes to commit what is already captured.
func (b *Tiered) waitPinned() {
	limit := b.member.limit.Load()
	room := limit - limit/spillFraction // what the next dirty delta needs stays free
	for limit > 0 && len(b.run.pending) > 0 && b.run.pinnedOut+b.run.dirtyBytes > room && b.ctx.Err() == nil {
		oldest := b.run.pending[0]
		b.run.pending[len(b.run.pending)-1].startChain(b.ctx) // observed below and by poll
		t := time.Now()
		<-oldest.done
		b.cnt.backpressureNanos.Add(int64(time.Since(t)))
		b.observe()
	}
}

// captureDelta detaches the dirty entries (and the operator state) as a snapshot that builds
// on the pending ones.
func (b *Tiered) captureDelta(id uint64, spill bool) *snapshot {
	b.waitPinned()
	b.run.captureSeq++
	s := &snapshot{b: b, id: id, seq: b.run.captureSeq, spill: spill, names: b.run.names, done: make(chan struct{})}
	// This loop is the runner's pause at a checkpoint: one pass, no slice growth. The dirty
	// list itself becomes the snapshot's pinned list (compacted in place), and the runner
	// starts a new one.
	dirty := b.run.dirty
	s.entries = make([]capEntry, 0, len(dirty))
	k := 0
	for _, e := range dirty {
		if !e.dirty {
			continue
		}
		e.dirty = false
		e.pin = s.seq
		s.entries = append(s.entries, capEntry{key: e.key, value: e.value, tomb: e.tomb})
		dirty[k] = e
		k++
		s.estimate += int64(len(e.key) + len(e.value))
		s.pinnedBytes += e.size
	}
	clear(dirty[k:])
	s.pinned = dirty[:k]
	b.run.pinnedOut += s.pinnedBytes
	b.run.dirty = make([]*entry, 0, max(k/2, 16))
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
