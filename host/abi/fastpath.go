package abi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Fast paths (docs/abi.md, "Fast paths")
//
// Import calls are transitions between Wasm and Go, and on wazero each one costs more than a
// typical operator's per-record work. Two mechanisms let the common case run with none:
//
//   - Prefetched values: before a keyed call the host writes one frame per prefetched state
//     (the per-key value, entry "") into the input buffer after the record; after the call it
//     applies the frames the guest marked DIRTY as puts or deletes.
//   - The output area: a guest-owned buffer of emitted records that the host drains when the
//     call returns (or on flush_output).
//
// Both are read and written only around export calls, with bounds-checked memory access, and
// never trusted: the host keeps its own record of each frame's capacity, and a malformed frame
// or area is a fault of the call.

const (
	frameHeader   = 16
	frameMinCap   = 64
	frameAbsent   = math.MaxUint32
	frameTooLarge = math.MaxUint32 - 1 // the value exists but is not in the frame: read it with get_async
	frameDirty    = 1
	outHeader     = 4
	minOutputArea = 12 // used + one record header
)

// prefetch holds the values gathered for the frames of the next call.
type prefetch struct {
	ids    []uint32 // state indices, in manifest prefetch order
	buf    []byte   // the values, back to back
	lens   []int64  // per frame: value length, or -1 when absent
	caps   []uint32 // per frame: the capacity the host reserved (the guest's copy is not trusted)
	at     []uint32 // per frame: guest address of the frame header in this call
	noKeys bool     // keyed state is not available: frames are absent and must stay clean
}

func align8(n int) int { return (n + 7) &^ 7 }

// gather reads the prefetched values through the handler (the scheduler has made them hot) and
// returns the input-buffer bytes the frames need after a record of base bytes.
func (in *Instance) gather(base int) (int, error) { return in.gatherInto(&in.pf, base) }

// gatherInto is gather into p (a batch keeps one prefetch per record).
func (in *Instance) gatherInto(p *prefetch, base int) (int, error) {
	p.buf = p.buf[:0]
	p.noKeys = false
	total := align8(base)
	for i, id := range p.ids {
		v, found, err := in.h.Get(id, nil)
		if err != nil {
			var c Code
			if !errors.As(err, &c) {
				return 0, &Fault{Operator: in.m.Manifest.Name, Kind: FaultHost, Err: fmt.Errorf("prefetching state %q: %w", in.m.Manifest.States[id], err)}
			}
			found, p.noKeys = false, true
		}
		if !found {
			p.lens[i] = -1
			p.caps[i] = frameMinCap
		} else if len(v) > in.limits.MaxPrefetchValue {
			// Too large to travel with every record (and to keep the input buffer that large
			// for the instance's life): the guest reads it with get_async.
			p.lens[i] = -2
			p.caps[i] = frameMinCap
		} else {
			p.lens[i] = int64(len(v))
			p.buf = append(p.buf, v...)
			c := max(frameMinCap, align8(len(v)+len(v)/2))
			if c > math.MaxInt32 {
				return 0, &Fault{Operator: in.m.Manifest.Name, Kind: FaultHost, Err: errors.New("prefetched value too large")}
			}
			p.caps[i] = uint32(c)
		}
		total += frameHeader + int(p.caps[i])
	}
	return total, nil
}

// writeInput writes the record (key, then value, back to back) and the gathered frames into
// the input buffer, whose first need bytes ensureInput has made available. It writes through one
// view of guest memory rather than composing a copy first: each api.Memory access is a call
// through an interface, and each intermediate copy is a copy.
func (in *Instance) writeInput(need int, key, value []byte) {
	dst, ok := in.mem.Read(in.inPtr, uint32(need))
	if !ok {
		// ensureInput checked [inPtr, inPtr+inCap) against memory, and memory never shrinks.
		panic("abi: input buffer outside memory")
	}
	in.writeRecord(&in.pf, dst, in.inPtr, key, value)
}

// writeRecord writes one record and p's frames to dst, the view of guest memory at addr.
func (in *Instance) writeRecord(p *prefetch, dst []byte, addr uint32, key, value []byte) {
	n := copy(dst, key)
	n += copy(dst[n:], value)
	off := 0
	for i := range p.ids {
		start := align8(n)
		clear(dst[n:start])
		n = start
		p.at[i] = addr + uint32(n)
		l := uint32(frameAbsent)
		switch {
		case p.lens[i] >= 0:
			l = uint32(p.lens[i])
		case p.lens[i] == -2:
			l = frameTooLarge
		}
		binary.LittleEndian.PutUint32(dst[n:], l)
		binary.LittleEndian.PutUint32(dst[n+4:], p.caps[i])
		binary.LittleEndian.PutUint64(dst[n+8:], 0) // flags, reserved
		n += frameHeader
		vl := int(max(0, p.lens[i]))
		copy(dst[n:], p.buf[off:off+vl])
		off += vl
		// The rest of the value area is the guest's; only the last frame's end needs to be
		// within what is written, and the input buffer is large enough for every capacity.
		if i < len(p.ids)-1 {
			clear(dst[n+vl : n+int(p.caps[i])])
			n += int(p.caps[i])
		} else {
			n += vl
		}
	}
}

// writeBack applies the frames the guest marked DIRTY, after a successful keyed call. The
// frames lie back to back from the first one's header to the end of the last one's capacity,
// and are read through one view of that span.
func (in *Instance) writeBack(k callKind) error { return in.writeBackFrames(&in.pf, k) }

// writeBackFrames is writeBack of p's frames.
func (in *Instance) writeBackFrames(p *prefetch, k callKind) error {
	last := len(p.ids) - 1
	span, ok := in.mem.Read(p.at[0], p.at[last]-p.at[0]+frameHeader+p.caps[last])
	if !ok {
		return in.abiFault(k, "the prefetch frames are outside memory")
	}
	for i, id := range p.ids {
		f := span[p.at[i]-p.at[0]:]
		if binary.LittleEndian.Uint32(f[8:])&frameDirty == 0 {
			continue
		}
		if p.noKeys {
			return in.abiFault(k, "prefetch frame %d written, but keyed state is not available in this pipeline", i)
		}
		l := binary.LittleEndian.Uint32(f)
		var err error
		switch {
		case l == frameAbsent:
			err = in.h.Delete(id, nil)
		case l > p.caps[i]:
			return in.abiFault(k, "prefetch frame %d has length %d over its capacity %d", i, l, p.caps[i])
		default:
			err = in.h.Put(id, nil, f[frameHeader:frameHeader+l:frameHeader+l])
		}
		if err != nil {
			return in.hostFault(k, err)
		}
	}
	return nil
}

// drainOutput delivers the records in the output area, in order, and empties it. The area is
// read through one view of guest memory (no copy): records are delivered straight from it, and
// used is reset in place.
func (in *Instance) drainOutput(k callKind) error {
	if in.outCap == 0 {
		return nil
	}
	area, ok := in.mem.Read(in.outPtr, in.outCap)
	if !ok {
		return in.abiFault(k, "the output area is outside memory")
	}
	used := binary.LittleEndian.Uint32(area)
	if used == 0 {
		return nil
	}
	if used > in.outCap-outHeader {
		return in.abiFault(k, "the output area says %d bytes are used, but holds only %d", used, in.outCap-outHeader)
	}
	if err := in.deliverArea(k, area[outHeader:outHeader+used]); err != nil {
		return err
	}
	// Emit copies, and no guest code ran since the view was taken: it is still valid.
	binary.LittleEndian.PutUint32(area, 0)
	return nil
}

// deliverArea passes the output-area records in data to the handler, in order, with the emit
// limits of one call.
func (in *Instance) deliverArea(k callKind, data []byte) error {
	for len(data) > 0 {
		if len(data) < 8 {
			return in.abiFault(k, "the output area ends inside a record header")
		}
		kl, vl := binary.LittleEndian.Uint32(data), binary.LittleEndian.Uint32(data[4:])
		if uint64(kl)+uint64(vl) > uint64(len(data)-8) {
			return in.abiFault(k, "an output-area record runs past the used bytes")
		}
		if int(kl) > in.limits.MaxRecordKey || int(vl) > in.limits.MaxEmitValue || in.emits >= in.limits.MaxEmitsPerCall {
			return in.abiFault(k, "an output-area record exceeds the emit limits")
		}
		key, val := data[8:8+kl], data[8+kl:8+kl+vl]
		if err := in.h.Emit(key, val); err != nil {
			return in.hostFault(k, err)
		}
		in.emits++
		data = data[8+kl+vl:]
	}
	return nil
}

func (in *Instance) abiFault(k callKind, format string, args ...any) error {
	in.broken = true
	return &Fault{Operator: in.m.Manifest.Name, Export: callExport[k], Kind: FaultABI, Err: fmt.Errorf(format, args...), GuestMessage: in.guestMessage()}
}

func (in *Instance) hostFault(k callKind, err error) error {
	in.broken = true
	var he *HostError
	if errors.As(err, &he) {
		err = he.Err
	}
	return &Fault{Operator: in.m.Manifest.Name, Export: callExport[k], Kind: FaultHost, Err: err, GuestMessage: in.guestMessage()}
}

// outputArea serves the output_area import.
func (in *Instance) outputArea(ptr, n uint32) uint64 {
	switch in.kind {
	case callManifest, callKey, callInput, callMigrate:
		return i32result(NotAllowed)
	}
	if (ptr != 0 || n != 0) && n < minOutputArea {
		return i32result(InvalidArgument)
	}
	if n != 0 && !in.inBounds(ptr, n) {
		return i32result(OutOfBounds)
	}
	if in.outCap != 0 {
		if in.batch.on {
			if err := in.flushBatch(); err != nil {
				panic(err)
			}
		} else if in.allowed(capEmit) {
			if err := in.drainOutput(in.kind); err != nil {
				panic(err)
			}
		} else if used, _ := in.mem.ReadUint32Le(in.outPtr); used != 0 {
			return i32result(NotAllowed) // records there could not be delivered now
		}
	}
	in.outPtr, in.outCap = ptr, n
	return 0
}

// flushOutput serves the flush_output import.
func (in *Instance) flushOutput() uint64 {
	if !in.allowed(capEmit) {
		return i32result(NotAllowed)
	}
	if in.batch.on {
		if err := in.flushBatch(); err != nil {
			panic(err)
		}
		return 0
	}
	if err := in.drainOutput(in.kind); err != nil {
		panic(err)
	}
	return 0
}
