package state

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/binary"
	"errors"

	"github.com/clink-wasm/clink-wasm/host/state/internal/format"
)

// scanBatch bounds the bytes of blocks a scan holds per segment: it reads each segment's
// blocks in ranged reads of about this size.
const scanBatch = 1 << 20

// ErrScanAfterWrite refuses ScanRestored on a backend that was written to.
var ErrScanAfterWrite = errors.New("state: ScanRestored after writes: scan a restored backend before its first write")

// ScanRestored calls fn for every live entry that the backend's durable tier held when it was
// opened (the restored checkpoint, within the backend's key groups), in durable-key order
// (key group, state name, record key, entry), each key once with its newest value; deleted
// keys are skipped. name is the entry's state name as persisted (a state the module no longer
// declares is visited too), record its record key, entry its entry; the slices are valid only
// during fn. An error from fn stops the scan and is returned.
//
// It is what a host-driven migration of a restored checkpoint runs (host/pipeline): it reads
// the segments a batch of blocks at a time, so it holds at most about 1 MiB of blocks per
// segment plus the segments' indexes, whatever the state's size. Runner side, before the
// first write (ErrScanAfterWrite otherwise): fn may Put and Delete on the backend, which go to
// the hot tier and spill under its budget as usual; the scan reads the durable version of its
// start, so it never sees its own writes.
func (b *Tiered) ScanRestored(ctx context.Context, fn func(name string, record, entry, value []byte) error) error {
	if len(b.run.hot) > 0 || len(b.run.pending) > 0 {
		return ErrScanAfterWrite
	}
	v := b.version.Load()
	var scans []*segmentScan
	for age, s := range v.segs {
		use := s.ref.Use.Intersect(b.rng)
		if use.Empty() {
			continue
		}
		m, err := b.loadMeta(ctx, s)
		if err != nil {
			return err
		}
		scans = append(scans, &segmentScan{b: b, ctx: ctx, object: s.object, blocks: m.Blocks, use: use, age: age})
	}
	err := mergeScans(scans, func(sc *segmentScan) error {
		if sc.tomb {
			return nil
		}
		name, record, entry, ok := splitDurableKey(sc.key)
		if !ok {
			b.cnt.corruptions.Add(1)
			return format.Corruptf(sc.object, 0, "malformed durable key")
		}
		return fn(name, record, entry, sc.value)
	})
	if err != nil {
		return err
	}
	return ctx.Err()
}

// mergeScans merges segments' scans in durable-key order and calls fn once for each key, with
// the scan that holds its newest entry (the lowest age) positioned on it; sc.key and sc.value
// are valid only during fn. An error from fn or from a scan stops the merge.
func mergeScans(scans []*segmentScan, fn func(sc *segmentScan) error) error {
	h := make(scanHeap, 0, len(scans))
	for _, sc := range scans {
		if sc.next() {
			h = append(h, sc)
		} else if sc.err != nil {
			return sc.err
		}
	}
	heap.Init(&h)
	var last []byte
	for len(h) > 0 {
		sc := h[0]
		if last == nil || !bytes.Equal(sc.key, last) {
			// The first time a key appears it comes from the newest segment (heap order).
			last = append(last[:0], sc.key...)
			if err := fn(sc); err != nil {
				return err
			}
		}
		if sc.next() {
			heap.Fix(&h, 0)
		} else {
			if sc.err != nil {
				return sc.err
			}
			heap.Pop(&h)
		}
	}
	return nil
}

// splitDurableKey is format.AppendDurableKey's inverse (the key group aside).
func splitDurableKey(k []byte) (name string, record, entry []byte, ok bool) {
	if len(k) < 2 {
		return "", nil, nil, false
	}
	d := k[2:]
	n, w := binary.Uvarint(d)
	if w <= 0 || n > uint64(len(d)-w) {
		return "", nil, nil, false
	}
	name, d = string(d[w:w+int(n)]), d[w+int(n):]
	n, w = binary.Uvarint(d)
	if w <= 0 || n > uint64(len(d)-w) {
		return "", nil, nil, false
	}
	return name, d[w : w+int(n)], d[w+int(n):], true
}

// segmentScan iterates one segment's entries within its used key groups, reading its blocks
// in batches of about scanBatch bytes: a restore's scan (ScanRestored) and a compaction's
// inputs hold at most that much of each segment, whatever its size.
type segmentScan struct {
	b      *Tiered
	ctx    context.Context
	object string
	blocks []format.BlockHandle
	use    KeyGroupRange
	age    int // position in the version: lower is newer

	nextBlock int    // next block to read
	batch     []byte // the blocks read, from batchOff
	bOff      int64
	queue     []format.BlockHandle // blocks of batch not yet opened
	it        *format.BlockIter

	key, value []byte
	tomb       bool
	err        error
}

func (s *segmentScan) next() bool {
	for {
		if s.it != nil && s.it.Next() {
			kg := format.DurableKeyGroup(s.it.Key)
			if kg >= s.use.Hi {
				s.it, s.queue, s.nextBlock = nil, nil, len(s.blocks) // sorted by key group: done
				return false
			}
			if !s.use.Contains(kg) {
				continue
			}
			s.key, s.value, s.tomb = s.it.Key, s.it.Value, s.it.Tomb
			return true
		}
		if s.it != nil && s.it.Err != nil {
			s.err = s.it.Err
			return false
		}
		if len(s.queue) == 0 && !s.read() {
			return false
		}
		bh := s.queue[0]
		s.queue = s.queue[1:]
		rel := bh.Off - s.bOff
		s.it, s.err = format.OpenBlock(s.object, bh.Off, s.batch[rel:rel+bh.N])
		if s.err != nil {
			s.b.cnt.corruptions.Add(1)
			return false
		}
	}
}

// prime reads the scan's first batch of blocks ahead of its first next, so that the scans of a
// merge can all read theirs at once (see compact); s.err holds a failure.
func (s *segmentScan) prime() {
	if s.queue == nil && s.it == nil {
		s.read()
	}
}

// read fetches the next batch of blocks, skipping those wholly below the used key groups.
func (s *segmentScan) read() bool {
	for s.nextBlock < len(s.blocks) && len(s.blocks[s.nextBlock].LastKey) >= 2 && format.DurableKeyGroup(s.blocks[s.nextBlock].LastKey) < s.use.Lo {
		s.nextBlock++
	}
	if s.nextBlock >= len(s.blocks) {
		return false
	}
	first := s.nextBlock
	end := s.nextBlock + 1
	for end < len(s.blocks) && s.blocks[end].Off == s.blocks[end-1].Off+s.blocks[end-1].N &&
		s.blocks[end].Off+s.blocks[end].N-s.blocks[first].Off <= scanBatch {
		end++
	}
	off, n := s.blocks[first].Off, s.blocks[end-1].Off+s.blocks[end-1].N-s.blocks[first].Off
	if err := s.b.s.acquire(s.ctx); err != nil {
		s.err = err
		return false
	}
	data, err := s.b.s.os.get(s.ctx, s.object, off, n)
	s.b.s.release()
	if err != nil {
		s.err = err
		return false
	}
	if int64(len(data)) != n {
		s.b.cnt.corruptions.Add(1)
		s.err = format.Corruptf(s.object, off, "short read: %d of %d bytes", len(data), n)
		return false
	}
	s.batch, s.bOff, s.queue, s.nextBlock = data, off, s.blocks[first:end], end
	return true
}

type scanHeap []*segmentScan

func (h scanHeap) Len() int { return len(h) }
func (h scanHeap) Less(i, j int) bool {
	if c := bytes.Compare(h[i].key, h[j].key); c != 0 {
		return c < 0
	}
	return h[i].age < h[j].age
}
func (h scanHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *scanHeap) Push(x any)   { *h = append(*h, x.(*segmentScan)) }
func (h *scanHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
