package state

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/clink-wasm/clink-wasm/host/state/internal/format"
)

// Compaction merges a run of a lineage's newest segments into one (or a few) sorted segments
// in the background. The result is installed by the next checkpoint commit, which replaces the
// run in its manifest; compaction itself never writes a manifest, so commits stay serialised in
// Persist. A run is chosen size-tiered: the newest segments, extended towards older ones while
// the newer part is at least half the size of the next older segment, so each byte is
// rewritten O(log n) times.

type compactResult struct {
	inputs  []string // segment names, newest first, contiguous in the base manifest
	outputs []format.SegRef
}

// apply replaces the inputs in segs with the outputs, if segs still holds them contiguously.
func (c *compactResult) apply(segs []format.SegRef) ([]format.SegRef, bool) {
	for i := range segs {
		if segs[i].Name != c.inputs[0] {
			continue
		}
		if i+len(c.inputs) > len(segs) {
			return nil, false
		}
		for j, n := range c.inputs {
			if segs[i+j].Name != n {
				return nil, false
			}
		}
		out := make([]format.SegRef, 0, len(segs)-len(c.inputs)+len(c.outputs))
		out = append(out, segs[:i]...)
		out = append(out, c.outputs...)
		return append(out, segs[i+len(c.inputs):]...), true
	}
	return nil, false
}

// pickRun chooses how many of the newest segments to merge (0: none needed).
func pickRun(segs []format.SegRef, maxSegments int) int {
	if len(segs) <= maxSegments {
		return 0
	}
	acc := segs[0].Size
	j := 1
	for j < len(segs) && acc*2 >= segs[j].Size {
		acc += segs[j].Size
		j++
	}
	if j < 2 {
		j = 2
	}
	// Merge enough to get back under the limit.
	return max(j, len(segs)-maxSegments+1)
}

func compactionDebt(segs []format.SegRef, maxSegments int) int64 {
	n := pickRun(segs, maxSegments)
	var d int64
	for _, s := range segs[:n] {
		d += s.Size
	}
	return d
}

// maintain runs compaction and (on the subtask owning key group 0) garbage collection after
// commits, until Close.
func (b *Tiered) maintain() {
	defer b.wg.Done()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-b.kick:
		}
		if err := b.compactSpills(b.ctx); err != nil && b.ctx.Err() == nil {
			b.cfg.logger.Warn("state: merging spills failed; retried after the next spill",
				"operator", b.name, "tenant", b.tenant, "key_groups", b.rng.String(), "err", err)
		}
		if err := b.compact(b.ctx); err != nil && b.ctx.Err() == nil {
			// Compaction is an optimisation: a failure leaves the segments as they are and is
			// retried after the next commit.
			b.cfg.logger.Warn("state: compaction failed; retried after the next commit",
				"operator", b.name, "tenant", b.tenant, "key_groups", b.rng.String(), "err", err)
		}
		if b.rng.Lo == 0 {
			b.mu.Lock()
			due := time.Since(b.mu.lastGC) >= b.cfg.gcInterval
			if due {
				b.mu.lastGC = time.Now()
			}
			b.mu.Unlock()
			if due {
				if err := b.collectGarbage(b.ctx); err != nil && b.ctx.Err() == nil {
					b.cfg.logger.Warn("state: garbage collection failed; retried at the next interval",
						"operator", b.name, "tenant", b.tenant, "err", err)
				}
			}
		}
	}
}

// compact merges the run pickRun chooses from the current base, if any and if no result is
// already waiting.
func (b *Tiered) compact(ctx context.Context) error {
	b.mu.Lock()
	base, pending := b.mu.base, b.mu.compaction
	b.mu.Unlock()
	if pending != nil {
		return nil
	}
	n := pickRun(base.Segs, b.cfg.maxSegments)
	if n == 0 {
		return nil
	}
	run := base.Segs[:n]
	bottom := n == len(base.Segs) // nothing older: tombstones can go
	outs, err := b.mergeSegments(ctx, run, bottom, fmt.Sprintf("c%019d", base.Checkpoint))
	if err != nil {
		return err
	}
	res := &compactResult{outputs: outs}
	for _, s := range run {
		res.inputs = append(res.inputs, s.Name)
	}
	b.mu.Lock()
	if b.mu.compaction == nil && !b.mu.closed {
		b.mu.compaction = res
	}
	b.mu.Unlock()
	return nil
}

// spillMergeAt is how many spills waiting for a checkpoint to adopt them make the maintenance
// goroutine merge them into one segment (see compactSpills).
const spillMergeAt = 8

// compactSpills merges the spills no checkpoint has adopted yet into one segment (or a few)
// once there are spillMergeAt of them. A small hot tier spills often (about 40 per second at
// a tenth of the counter benchmark's state), and each spill is a segment of its own until the
// next checkpoint adopts it and a compaction of the base merges it: every lookup meanwhile
// reads one block per segment its keys are in, and every segment's filter and index stay in
// the hot budget, the head's keys once per spill (a Zipf head is in every delta). The merge
// keeps each key's newest entry and its tombstones (the base below may hold the key).
//
// The result replaces its inputs in the spills (and so in the version cold reads use) if they
// are still there and no commit is adopting them; a commit adopts them in order, so if one
// did, they are contiguous in the base and the result becomes the base's compaction result,
// installed by the next commit (if none is waiting already; else it is dropped, and garbage
// collection removes its segments).
func (b *Tiered) compactSpills(ctx context.Context) error {
	b.mu.Lock()
	if len(b.mu.spills) < spillMergeAt || b.mu.adopting || b.mu.closed {
		b.mu.Unlock()
		return nil
	}
	run := slices.Clone(b.mu.spills)
	tag := fmt.Sprintf("m%019d", b.mu.base.Checkpoint)
	b.mu.merging = true
	b.mu.Unlock()
	outs, err := b.mergeSegments(ctx, run, false, tag)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.merging = false
	if err != nil {
		return err
	}
	names := make([]string, len(run))
	for i, r := range run {
		names[i] = r.Name
	}
	if b.mu.closed {
		return nil
	}
	sp := b.mu.spills
	if n := len(sp) - len(run); n >= 0 && !b.mu.adopting && slices.EqualFunc(sp[n:], names, func(r format.SegRef, name string) bool { return r.Name == name }) {
		b.mu.spills = slices.Concat(sp[:n], outs)
		b.setVersionLocked(b.buildVersionLocked(b.mu.base))
		b.cnt.spillMerges.Add(1)
		return nil
	}
	if b.mu.compaction == nil {
		b.mu.compaction = &compactResult{inputs: names, outputs: outs}
	}
	return nil
}

// mergeSegments merges run (segments newest first) into new segments of the pool, each key
// once with its newest entry; tombstones are dropped when bottom (nothing older holds keys).
func (b *Tiered) mergeSegments(ctx context.Context, run []format.SegRef, bottom bool, tag string) ([]format.SegRef, error) {
	// The inputs' indexes (most are loaded: the live version holds them, and the segments this
	// backend wrote come with theirs) and their first batches are read in parallel: one at a
	// time, a run of n small spills cost 2n round trips (8 s for 36 inputs on a loaded
	// versitygw at 20 ms, longer than the checkpoint interval that installs the result).
	scans := make([]*segmentScan, len(run))
	errs := make([]error, len(run))
	var wg sync.WaitGroup
	for i, s := range run {
		object := b.root + s.Name
		b.mu.Lock()
		var m *format.SegMeta
		if ls := b.mu.live[s.Name]; ls != nil && ls.ref.MetaOff == s.MetaOff && ls.ref.MetaLen == s.MetaLen {
			m = ls.meta.Load()
		}
		b.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if m == nil {
				if m, errs[i] = b.readMeta(ctx, object, s); errs[i] != nil {
					return
				}
			}
			sc := &segmentScan{b: b, ctx: ctx, object: object, blocks: m.Blocks, use: s.Use, age: i}
			sc.prime()
			scans[i], errs[i] = sc, sc.err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// The merged entries stream into segment writers, each written out as soon as it is full:
	// what a compaction holds is about scanBatch bytes of each input and one output segment,
	// never the merged entries
	// (a run of spilled deltas can hold every key of the operator).
	w := format.NewSegWriter(b.cfg.blockSize, b.cfg.bloomBitsPerKey)
	var outs []format.SegRef
	flush := func() error {
		if w.Len() == 0 {
			return nil
		}
		ref, err := b.putSegment(ctx, tag, w)
		if err != nil {
			return err
		}
		outs = append(outs, ref)
		w = format.NewSegWriter(b.cfg.blockSize, b.cfg.bloomBitsPerKey)
		return nil
	}
	err := mergeScans(scans, func(sc *segmentScan) error {
		if bottom && sc.tomb {
			return nil
		}
		w.Add(format.SegEntry{Key: sc.key, Value: sc.value, Tomb: sc.tomb}) // add copies
		if w.Size() >= b.cfg.segmentBytes {
			return flush()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return outs, nil
}

// collectGarbage deletes manifests older than the retained complete checkpoints (savepoints
// excepted), then segments that no remaining manifest references and that are older than the
// retention period (younger ones may belong to a checkpoint still being written).
func (b *Tiered) collectGarbage(ctx context.Context) error {
	objs, err := b.s.os.list(ctx, b.root+"manifests/")
	if err != nil {
		return err
	}
	names := make([]string, len(objs))
	for i, o := range objs {
		names[i] = strings.TrimPrefix(o.name, b.root)
	}
	complete := format.CompleteCheckpoints(names, b.numKG)
	spObjs, err := b.s.os.list(ctx, b.root+"savepoints/")
	if err != nil {
		return err
	}
	savepoints := map[uint64]bool{}
	for _, o := range spObjs {
		var c uint64
		if _, err := fmt.Sscanf(strings.TrimPrefix(o.name, b.root+"savepoints/"), "%d", &c); err == nil {
			savepoints[c] = true
		}
	}
	var keepFrom uint64
	if len(complete) >= b.cfg.retainCheckpoints {
		keepFrom = complete[b.cfg.retainCheckpoints-1]
	}
	b.mu.Lock()
	restored := b.mu.base.Checkpoint
	b.mu.Unlock()
	referenced := map[string]bool{}
	for _, n := range names {
		c, _, ok := format.ParseManifestName(n)
		if !ok {
			continue
		}
		if c < keepFrom && !savepoints[c] && c != restored {
			if err := b.s.os.del(ctx, b.root+n); err != nil {
				return err
			}
			b.mu.Lock()
			delete(b.mu.gcCache, n)
			b.mu.Unlock()
			continue
		}
		b.mu.Lock()
		segs, ok := b.mu.gcCache[n]
		b.mu.Unlock()
		if !ok {
			data, err := b.s.os.get(ctx, b.root+n, 0, -1)
			if err != nil {
				return err
			}
			m, err := format.DecodeManifest(b.root+n, data)
			if err != nil {
				b.cnt.corruptions.Add(1)
				return err
			}
			for _, s := range m.Segs {
				segs = append(segs, s.Name)
			}
			b.mu.Lock()
			b.mu.gcCache[n] = segs
			b.mu.Unlock()
		}
		for _, s := range segs {
			referenced[s] = true
		}
	}
	// Segments of this lineage's live version and pending compaction are referenced too.
	b.mu.Lock()
	for n := range b.mu.live {
		referenced[n] = true
	}
	if c := b.mu.compaction; c != nil {
		for _, o := range c.outputs {
			referenced[o.Name] = true
		}
	}
	b.mu.Unlock()
	segObjs, err := b.s.os.list(ctx, b.root+"segments/")
	if err != nil {
		return err
	}
	cutoff := time.Now().Add(-b.cfg.retention)
	for _, o := range segObjs {
		n := strings.TrimPrefix(o.name, b.root)
		if referenced[n] || o.modTime.After(cutoff) {
			continue
		}
		if err := b.s.os.del(ctx, o.name); err != nil {
			return err
		}
	}
	return nil
}
