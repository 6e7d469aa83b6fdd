package pipeline

import (
	"sync"

	"github.com/clink-wasm/clink-wasm/host/scheduler"
)

// # Batch reuse
//
// A batch that crosses a channel is a slice of batchRecords elements whose keys and values
// point into an arena of the batch's own. Both used to be allocated for every batch and left
// to the garbage collector: about 88 + 45 bytes a record, most of a pipeline's allocation and
// so most of its GC. Now a channel whose consumer hands its batches back ("pooled": an
// operator subtask, whose controller releases each input batch once nothing aliases it,
// scheduler.WithInputRelease; a native operator and a sink subtask, once they processed it)
// takes its batches from the attempt's batchPool, and the consumer returns them there.
//
// INVARIANT (ownership): a pooled batch belongs to exactly one party at a time. The producer
// (an edgeOut) owns it from get until it sends it; the channel, the consumer's input merger
// and the consumer own it from then until the consumer calls release; the pool owns it from
// release until the next get. Nobody reads or writes a batch it does not own: release is the
// consumer's promise that it holds no reference into the batch's elements or its arena any
// more (for an operator, the controller's INVARIANT in host/scheduler/release.go). The mutex
// orders a release before the get that hands the batch out again, so the producer's writes
// happen after the consumer's last reads.
//
// The consumer's input merger, the one party in between that keeps part of a batch for later
// (the records after a barrier, until every input delivered the barrier), copies that part
// into a batch of its own instead of keeping a slice of the original: every slice a consumer
// releases starts at its batch's first element, which is how release finds the batch. A slice
// the pool does not know (the merger's one-element watermark and barrier batches, a batch of an
// unpooled channel) is ignored.
//
// Memory: the pool keeps at most maxFree idle batches, each with at most maxBatchArena bytes
// of arena; the batches in use are bounded as before (channels × channelBatches batches in
// the channels, and what each consumer holds: the controller's admitted records, by its
// in-flight cap). A batch that is never released (its consumer failed, or it is not pooled)
// is simply left to the garbage collector with the attempt.

const (
	// batchArena is a new batch's arena: 256 records of up to 64 bytes. It grows when a
	// batch's records need more, up to maxBatchArena, beyond which a batch is sent before it
	// is full (a record larger than that alone gets an arena of its size).
	batchArena    = 16 << 10
	maxBatchArena = 1 << 20
)

// batch is a batch being filled or in flight: its elements and the arena of their bytes.
type batch struct {
	els    []scheduler.Element // cap batchRecords, never grown: its first element identifies it
	arena  []byte
	pooled bool // from the pool: release brings it back
	idle   bool // in the pool's free list (guarded by the pool's mutex)
}

// add appends k and v to the batch's arena and returns them as one slice (k then v). The
// caller has made room (room).
func (b *batch) add(k, v []byte) []byte {
	at := len(b.arena)
	b.arena = append(append(b.arena, k...), v...)
	return b.arena[at:len(b.arena):len(b.arena)]
}

// room makes room for n more bytes in the arena, reporting false when the batch must be sent
// first (it has records and its arena is at its largest). A new arena leaves the records
// already in the batch pointing into the old one, which stays alive while they do.
func (b *batch) room(n int) bool {
	if n <= cap(b.arena)-len(b.arena) {
		return true
	}
	if len(b.els) > 0 && cap(b.arena) >= maxBatchArena {
		return false
	}
	b.arena = make([]byte, 0, max(min(2*cap(b.arena), maxBatchArena), batchArena, n))
	return true
}

// batchPool is an attempt's idle pooled batches.
type batchPool struct {
	mu      sync.Mutex
	free    []*batch
	known   map[*scheduler.Element]*batch // every pooled batch not dropped, by its first element
	maxFree int
	// distance is reuseDistance (tests change it).
	distance int
	// poison, in tests, overwrites a released batch (every element and every arena byte) so
	// that a read after release shows as wrong data instead of passing unnoticed.
	poison bool
}

// reuseDistance: a released batch is reused only once that many others were released after
// it (the free list is a queue, and get takes from it only when it is longer than this), so
// that the consumer's core no longer holds its cache lines when the producer writes them
// again. Reused at once, a batch's lines are still in the consumer core's cache, and every
// write of the producer's then waits for a cross-core invalidation: in the issue 12 profile
// the producer's append of an element took about 95 ns with immediate reuse and 12 ns at
// this distance (32 batches of about 40 KB, beyond a core's 1 MiB L2 here).
const reuseDistance = 32

// poisonBatches is set by the package's tests (export_test.go).
var poisonBatches bool

// poisonByte fills a poisoned arena.
const poisonByte = 0xEE

func newBatchPool(maxFree int) *batchPool {
	return &batchPool{known: map[*scheduler.Element]*batch{}, maxFree: maxFree, distance: reuseDistance, poison: poisonBatches}
}

// get returns an empty pooled batch.
func (p *batchPool) get() *batch {
	p.mu.Lock()
	if n := len(p.free); n > p.distance {
		b := p.free[0]
		copy(p.free, p.free[1:])
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		b.idle = false
		p.mu.Unlock()
		return b
	}
	b := &batch{els: make([]scheduler.Element, 0, batchRecords), arena: make([]byte, 0, batchArena), pooled: true}
	p.known[&b.els[:1][0]] = b
	p.mu.Unlock()
	return b
}

// release takes back the batch els starts (see the INVARIANT above); it ignores a slice that
// is not the start of a pooled batch.
func (p *batchPool) release(els []scheduler.Element) {
	if p == nil || cap(els) == 0 {
		return
	}
	first := &els[:1][0]
	p.mu.Lock()
	b := p.known[first]
	if b == nil || b.idle { // not pooled; or released twice (a consumer's bug: ignored)
		p.mu.Unlock()
		return
	}
	if p.poison {
		poison(b)
	}
	b.els, b.arena = b.els[:0], b.arena[:0]
	if cap(b.arena) > maxBatchArena {
		b.arena = make([]byte, 0, batchArena)
	}
	if len(p.free) < p.maxFree {
		b.idle = true
		p.free = append(p.free, b)
	} else {
		delete(p.known, first)
	}
	p.mu.Unlock()
}

// poison overwrites every element of b (up to its capacity) and every byte of its arena.
func poison(b *batch) {
	a := b.arena[:cap(b.arena)]
	for i := range a {
		a[i] = poisonByte
	}
	els := b.els[:cap(b.els)]
	bad := a[:min(len(a), 3)]
	for i := range els {
		els[i] = scheduler.Element{Kind: scheduler.ElementRecord, Key: bad, Value: a, TS: -1, Pos: -1, CheckID: ^uint64(0)}
	}
}

// copyOf returns a pooled batch holding a copy of els, their keys and values included.
func (p *batchPool) copyOf(els []scheduler.Element) []scheduler.Element {
	b := p.get()
	n := 0
	for i := range els {
		n += len(els[i].Key) + len(els[i].Value)
	}
	if n > cap(b.arena) {
		b.arena = make([]byte, 0, n)
	}
	for _, el := range els {
		if el.Kind == scheduler.ElementRecord {
			kv := b.add(el.Key, el.Value)
			el.Key, el.Value = kv[:len(el.Key):len(el.Key)], kv[len(el.Key):]
		}
		b.els = append(b.els, el)
	}
	return b.els
}

// releaser returns p's release for scheduler.WithInputRelease, nil (no release) when p is nil.
func (p *batchPool) releaser() func([]scheduler.Element) {
	if p == nil {
		return nil
	}
	return p.release
}
