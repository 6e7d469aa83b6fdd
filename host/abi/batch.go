package abi

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Batch calls (docs/abi.md, "Batch calls")
//
// A module may export clink_process_batch(count) -> status. One call then processes count
// records of distinct keys, each laid out in the input buffer exactly as a clink_process input
// (key, value, its prefetch frames), after a header and one descriptor per record. It saves
// the per-call cost of an export call, which for a Go guest (the runtime's entry and the SDK's
// dispatch) is several times the host's.
//
// The guest writes the index of the record it is working on into the header's `current` word
// before it starts the record. Every import the host serves during the call first reads that
// word and, when it changed, makes the handler serve the new record (BatchHandler.SelectRecord):
// state, timers, emits, lookups and logs of a record are that record's, exactly as in a
// clink_process call. A trap is the record's that `current` names. When the call returns, the
// host completes the records in order as if each had been its own call: its share of the
// output area (up to the `out_end` the guest wrote into its descriptor), then its DIRTY frames.

// ExportProcessBatch is the optional batch entry point.
const ExportProcessBatch = "clink_process_batch"

// Batch layout in the input buffer.
const (
	batchHeader = 16 // u32 count, u32 current, u32 reserved, u32 reserved
	batchDesc   = 32 // per record, see docs/abi.md
	// MaxBatch is the most records one batch call may carry.
	MaxBatch = 256

	descOffset = 0  // u32: the record's offset from the start of the input buffer (8-aligned)
	descKeyLen = 4  // u32
	descValLen = 8  // u32
	descRC     = 12 // i32, written by the guest
	descTS     = 16 // i64
	descOutEnd = 24 // u32, written by the guest: the output area's used after the record
)

// BatchRecord is one record of a batch call.
type BatchRecord struct {
	Key, Value []byte
	TS         int64
}

// BatchHandler is a Handler that can serve the records of a batch call: SelectRecord(i) makes
// record i of the current batch the one whose state, timers, emits, lookups and logs the
// handler serves, until the next SelectRecord.
type BatchHandler interface {
	Handler
	SelectRecord(i int)
}

// batchState is the instance's current batch call.
type batchState struct {
	on      bool
	n       int
	cur     int // the record the handler serves
	hdr     uint32
	pfs     []prefetch // per record, when the module prefetches
	offs    []uint32   // per record: its offset in the input buffer
	drained int        // first record whose output is not yet fully delivered
	outPos  uint32     // bytes of the area's data already delivered
	// badCursor: syncBatch found the guest's current word moved back or past the batch.
	badCursor bool
}

// HasBatch reports whether the module exports clink_process_batch.
func (m *Module) HasBatch() bool { return m.hasBatch }

// ProcessBatch delivers recs, whose keys must be distinct, to one clink_process_batch call.
// The instance's handler must be a BatchHandler. It returns how many records completed
// (their outputs delivered and frames applied, in order), and, when that is fewer than
// len(recs), the fault of record done. Records after done were not applied: the guest did not
// run them, except when the fault is the host's own check of record done's outputs or frames
// after the call, in which case later records ran but nothing they left in the output area or
// frames was applied (their import calls were). The instance is broken after any fault.
func (in *Instance) ProcessBatch(recs []BatchRecord) (done int, err error) {
	n := len(recs)
	bh, ok := in.h.(BatchHandler)
	switch {
	case n == 0:
		return 0, nil
	case !in.m.hasBatch:
		return 0, errors.New("abi: module does not export " + ExportProcessBatch)
	case !ok:
		return 0, errors.New("abi: ProcessBatch needs a BatchHandler")
	case n > MaxBatch:
		return 0, fmt.Errorf("abi: batch of %d records, at most %d", n, MaxBatch)
	}
	b := &in.batch
	b.n, b.cur, b.drained, b.outPos = n, 0, 0, 0
	b.offs = b.offs[:0]
	npf := len(in.pf.ids)
	for len(b.pfs) < n && npf > 0 {
		b.pfs = append(b.pfs, prefetch{ids: in.pf.ids, lens: make([]int64, npf), caps: make([]uint32, npf), at: make([]uint32, npf)})
	}
	// Lay out: header, descriptors, then each record at an 8-aligned offset.
	total := batchHeader + batchDesc*n
	for i := range recs {
		r := &recs[i]
		off := align8(total)
		need := len(r.Key) + len(r.Value)
		if npf > 0 {
			bh.SelectRecord(i)
			if need, err = in.gatherInto(&b.pfs[i], need); err != nil {
				return 0, err
			}
		}
		b.offs = append(b.offs, uint32(off))
		total = off + need
	}
	if err := in.ensureInput(total); err != nil {
		return 0, err
	}
	dst, ok := in.mem.Read(in.inPtr, uint32(total))
	if !ok {
		panic("abi: input buffer outside memory") // ensureInput checked it
	}
	binary.LittleEndian.PutUint32(dst, uint32(n))
	clear(dst[4:batchHeader])
	for i := range recs {
		r := &recs[i]
		d := dst[batchHeader+batchDesc*i:]
		off := b.offs[i]
		binary.LittleEndian.PutUint32(d[descOffset:], off)
		binary.LittleEndian.PutUint32(d[descKeyLen:], uint32(len(r.Key)))
		binary.LittleEndian.PutUint32(d[descValLen:], uint32(len(r.Value)))
		binary.LittleEndian.PutUint32(d[descRC:], 0)
		binary.LittleEndian.PutUint64(d[descTS:], uint64(r.TS))
		binary.LittleEndian.PutUint64(d[descOutEnd:], 0)
		if npf > 0 {
			in.writeRecord(&b.pfs[i], dst[off:], in.inPtr+off, r.Key, r.Value)
		} else {
			n := copy(dst[off:], r.Key)
			copy(dst[int(off)+n:], r.Value)
		}
	}
	fn := in.export(&in.fnBatch, ExportProcessBatch)
	b.hdr = in.inPtr
	b.on = true
	bh.SelectRecord(0)
	in.begin(callBatch)
	in.stack[0] = uint64(n)
	callErr := fn.CallWithStack(in.ctx, in.stack)
	rc := int32(uint32(in.stack[0]))
	// The record the call ended in: the guest's cursor, or the last one the host served when
	// the cursor is out of range (then the fault is that).
	cur := b.cur
	bad := false
	if c, ok := in.mem.ReadUint32Le(b.hdr + 4); !ok || int(c) >= n || int(c) < b.cur {
		bad = true
	} else if !b.badCursor {
		cur = int(c)
	}
	b.badCursor = false
	b.on = false
	in.leaveShare()
	in.kind = callNone
	in.hasPending = false
	in.stdout.flush()
	in.stderr.flush()
	done = n
	var fault error
	switch {
	case callErr != nil:
		in.broken = true
		done, fault = cur, in.fault(callBatch, callErr)
	case bad:
		done, fault = cur, in.abiFault(callBatch, "the batch header's current record is %s", "outside the batch or behind the record the host last served")
	case rc != 0:
		in.broken = true
		done = cur
		fault = &Fault{Operator: in.m.Manifest.Name, Export: ExportProcessBatch, Kind: FaultReturn, Code: rc, GuestMessage: in.guestMessage()}
	}
	// Complete the records that returned, in order, as their own calls would have been.
	for j := range done {
		if rcj, _ := in.mem.ReadUint32Le(b.hdr + batchHeader + uint32(batchDesc*j) + descRC); rcj != 0 && fault == nil {
			// The guest went on past a failed record.
			return j, in.abiFault(callBatch, "record %d of the batch returned %d, but the batch went on", j, int32(rcj))
		}
		if j != b.cur {
			b.cur = j
			bh.SelectRecord(j)
		}
		if err := in.drainBatch(j+1, -1); err != nil {
			return j, err
		}
		if npf > 0 {
			if err := in.writeBackFrames(&b.pfs[j], callBatch); err != nil {
				return j, err
			}
		}
	}
	if fault == nil {
		// Everything the area holds was delivered: the rest was written after the last
		// record's out_end.
		if used, _ := in.mem.ReadUint32Le(in.outPtr); in.outCap != 0 && used != b.outPos {
			return n - 1, in.abiFault(callBatch, "the output area holds %d bytes past the last record's out_end", used-b.outPos)
		}
	}
	if in.outCap != 0 {
		if ok := in.mem.WriteUint32Le(in.outPtr, 0); !ok && fault == nil {
			return done, in.abiFault(callBatch, "the output area is outside memory")
		}
	}
	return done, fault
}

// syncBatch makes the handler serve the record the guest's cursor names. It runs at every
// import of a batch call and at fuel checks.
func (in *Instance) syncBatch() {
	b := &in.batch
	c, ok := in.mem.ReadUint32Le(b.hdr + 4)
	if !ok || int(c) == b.cur {
		return
	}
	if int(c) >= b.n || int(c) < b.cur {
		// The fault is the record the host last served: it cannot know which one the guest
		// was really on.
		b.badCursor = true
		panic(in.abiFault(callBatch, "the batch header's current record moved from %d to %d", b.cur, c))
	}
	b.cur = int(c)
	in.h.(BatchHandler).SelectRecord(b.cur)
	// Per-call bookkeeping starts again for the new record: its emit count, its guest error
	// message, its time budget.
	in.emits = 0
	in.lastError = in.lastError[:0]
	in.stderr.first = in.stderr.first[:0]
	in.seq++
}

// drainBatch delivers the output area's records of batch records [drained, upto) to each
// record in turn (their handler selected by the caller for the last one), up to each record's
// out_end. With flushCur >= 0 (flush_output during record flushCur == upto-1... see below),
// the records after the last out_end go to flushCur and the area is emptied.
func (in *Instance) drainBatch(upto, flushCur int) error {
	b := &in.batch
	if in.outCap == 0 {
		return nil
	}
	area, ok := in.mem.Read(in.outPtr, in.outCap)
	if !ok {
		return in.abiFault(callBatch, "the output area is outside memory")
	}
	used := binary.LittleEndian.Uint32(area)
	if used > in.outCap-outHeader {
		return in.abiFault(callBatch, "the output area says %d bytes are used, but holds only %d", used, in.outCap-outHeader)
	}
	data := area[outHeader : outHeader+used]
	sel := b.cur
	for j := b.drained; j < upto; j++ {
		end, ok := in.mem.ReadUint32Le(b.hdr + batchHeader + uint32(batchDesc*j) + descOutEnd)
		if !ok || end < b.outPos || end > used {
			return in.abiFault(callBatch, "record %d of the batch has out_end %d outside the output area's records [%d, %d]", j, end, b.outPos, used)
		}
		if j != sel {
			in.h.(BatchHandler).SelectRecord(j)
			sel = j
		}
		in.emits = 0
		if err := in.deliverArea(callBatch, data[b.outPos:end]); err != nil {
			return err
		}
		b.outPos = end
		b.drained = j + 1
	}
	if flushCur >= 0 {
		if flushCur != sel {
			in.h.(BatchHandler).SelectRecord(flushCur)
		}
		if err := in.deliverArea(callBatch, data[b.outPos:used]); err != nil {
			return err
		}
		binary.LittleEndian.PutUint32(area, 0)
		b.outPos = 0
		b.drained = flushCur
	} else if sel != b.cur {
		in.h.(BatchHandler).SelectRecord(b.cur)
	}
	return nil
}

// flushBatch is flush_output inside a batch call: every earlier record's output goes to it,
// the rest to the current record.
func (in *Instance) flushBatch() error {
	return in.drainBatch(in.batch.cur, in.batch.cur)
}
