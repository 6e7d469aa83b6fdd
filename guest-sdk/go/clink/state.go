package clink

import (
	"errors"
	"strconv"
	"unsafe"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"
)

// State is a named keyed state: a map from entry (state key) to value, one map per record key.
// Inside a call for record key K, every method reads or writes K's map only. Use a nil entry for
// a plain per-key value, or distinct entries for a per-key map.
//
// Declare states as package-level variables so they exist before the manifest is produced:
//
//	var seen = clink.NewState("seen")
//
// State methods are allowed in Process and OnTimer only (ErrNotAllowed elsewhere).
//
// # Prefetched states
//
// A state declared with [Prefetch] has its per-key value (the nil entry) delivered by the host
// with every record and timer, in a frame of the input buffer (docs/abi.md, "Prefetched
// values"). Get, GetInt64, Put, PutInt64 and Delete of the nil entry then read and write that
// frame and make no import call; the host writes a changed value back when the call returns.
// A value larger than the frame's room goes through the put import instead, and the reads that
// follow in the same call go through get_async until the entry is written again, so a call
// always reads what it wrote. Other entries of a prefetched state use the imports as usual.
type State struct {
	name  string
	index uint32

	// Prefetched states only.
	prefetch bool
	// frame is the address of this state's frame header in abi.Input during Process and
	// OnTimer, and nil outside them. A pointer rather than an offset, so that the fast paths
	// of GetInt64 and PutInt64 are small enough to be inlined into the operator.
	// INVARIANT: frame != nil only while the frame belongs to the current call (set by
	// loadFrames, reset by endFrames), so a stale frame is never read or written.
	//
	// The frame's len is FrameTooLarge while its value is not in the frame: as the host
	// delivered it, or after the entry was written with the put import (a value larger than
	// the frame; the frame is then not DIRTY, so the host ignores its len). Reads then go
	// through get_async until the next write to the frame.
	frame unsafe.Pointer
}

// A StateOption configures a State when it is declared.
type StateOption interface{ applyState(*State) }

type prefetchOption struct{}

func (prefetchOption) applyState(s *State) { s.prefetch = true }

// Prefetch declares a state whose per-key value (the nil entry) the operator reads on (nearly)
// every record: the host delivers it with the record and takes it back written, so a
// read-modify-write makes no import call. A module may prefetch at most 16 states; prefetch only
// those read on most records, since every prefetched value is loaded for every record and timer.
func Prefetch() StateOption { return prefetchOption{} }

// prefetched are the prefetched states, in manifest order: the order of their frames.
var prefetched []*State

// NewState declares a state. name is what the host persists: 1-128 characters of
// [A-Za-z0-9_.-], unique within the module. It panics on an invalid or duplicate name, when more
// than 16 states are prefetched, or when called after initialisation.
func NewState(name string, opts ...StateOption) *State {
	s := &State{name: name}
	for _, o := range opts {
		o.applyState(s)
	}
	s.index = uint32(declare("State", &stateNames, name, 256))
	if s.prefetch {
		if len(prefetched) == abi.MaxPrefetch {
			panic("clink: more than 16 prefetched states (NewState(" + strconv.Quote(name) + ", clink.Prefetch()))")
		}
		prefetched = append(prefetched, s)
	}
	return s
}

// Name returns the state's name.
func (s *State) Name() string { return s.name }

// Prefetched reports whether the state was declared with Prefetch.
func (s *State) Prefetched() bool { return s.prefetch }

// result is the SDK's result buffer, shared by Get and Lookup. It grows to the largest value
// read and is never shrunk.
var result = make([]byte, 0, 512)

// fetch completes a read whose value did not fit: it grows dst's spare room to n and takes the
// pending result into it.
func fetch(op string, dst []byte, n int) ([]byte, error) {
	if cap(dst)-len(dst) < n {
		grown := make([]byte, len(dst), len(dst)+n)
		copy(grown, dst)
		dst = grown
	}
	p, c := abi.Spare(dst)
	rc := abi.TakeResult(p, c)
	if rc < 0 {
		return dst, codeErr(op, int64(rc))
	}
	return dst[:len(dst)+int(rc)], nil
}

// Get reads entry of the current key's state. found is false when the entry is absent. The
// returned value is a view of a buffer owned by the SDK, valid until the next Get or Lookup on
// any State or Endpoint: copy it (or use AppendGet) to keep it. Get does not allocate unless the
// value is larger than every value read before.
//
// Get may suspend while the host loads a cold value; the operator does not see it.
func (s *State) Get(entry []byte) (value []byte, found bool, err error) {
	v, found, err := s.AppendGet(result[:0], entry)
	if cap(v) > cap(result) {
		result = v[:0]
	}
	return v, found, err
}

// AppendGet appends the value of entry to dst and returns the extended slice. found is false
// when the entry is absent (dst is returned unchanged).
func (s *State) AppendGet(dst, entry []byte) (_ []byte, found bool, err error) {
	if len(entry) == 0 && s.frame != nil && abi.Load32(s.frame) != abi.FrameTooLarge {
		v, found, err := s.frameValue()
		return append(dst, v...), found, err
	}
	p, c := abi.Spare(dst)
	n := abi.GetAsync(s.index, abi.Ptr(entry), uint32(len(entry)), p, c)
	switch {
	case n == abi.NotFound:
		return dst, false, nil
	case n < 0:
		return dst, false, codeErr("get "+s.name, int64(n))
	case uint32(n) <= c:
		return dst[:len(dst)+int(n)], true, nil
	}
	dst, err = fetch("get "+s.name, dst, int(n))
	return dst, err == nil, err
}

// Put sets entry of the current key's state to a copy of value. An empty value is a value, not
// a delete.
func (s *State) Put(entry, value []byte) error {
	if len(entry) == 0 && s.frame != nil {
		return s.putFrame(value)
	}
	if rc := abi.Put(s.index, abi.Ptr(entry), uint32(len(entry)), abi.Ptr(value), uint32(len(value))); rc < 0 {
		return codeErr("put "+s.name, int64(rc))
	}
	return nil
}

// Delete removes entry from the current key's state. Deleting an absent entry succeeds.
func (s *State) Delete(entry []byte) error {
	if len(entry) == 0 && s.frame != nil {
		s.writeFrame(abi.FrameAbsent, nil)
		return nil
	}
	if rc := abi.Delete(s.index, abi.Ptr(entry), uint32(len(entry))); rc < 0 {
		return codeErr("delete "+s.name, int64(rc))
	}
	return nil
}

// GetInt64 reads an entry written by PutInt64 (8 bytes, little-endian). found is false when the
// entry is absent (v is then 0). A value of another length is an ErrInvalidArgument error.
func (s *State) GetInt64(entry []byte) (v int64, found bool, err error) {
	// The prefetched value, decoded in place. This part is small (cost 116 in a wasm build,
	// above the inliner's 80 but inlined where PGO finds the call hot), so that an operator's
	// read of its frame makes no call at all: in Go's wasm code every call that is not inlined
	// costs tens of nanoseconds. loadFrames checked that the frame and its value area (at
	// least FrameMinCap bytes) lie in the input buffer.
	if h := s.frame; h != nil && len(entry) == 0 {
		switch abi.Load32(h) {
		case 8:
			return int64(abi.Load64(unsafe.Add(h, abi.FrameHeader))), true, nil
		case abi.FrameAbsent: // a key's first record
			return 0, false, nil
		}
	}
	return s.getInt64(entry)
}

// getInt64 is GetInt64 for everything but an 8-byte or absent value in the frame.
func (s *State) getInt64(entry []byte) (int64, bool, error) {
	var b [8]byte
	got, found, err := s.AppendGet(b[:0], entry)
	if err != nil || !found {
		return 0, found, err
	}
	if len(got) != 8 {
		return 0, true, &Error{Op: "get int64 " + s.name, Code: CodeInvalidArgument}
	}
	return Int64(got), true, nil
}

// PutInt64 writes v as 8 bytes, little-endian (the layout the AssemblyScript SDK's putI64 uses).
func (s *State) PutInt64(entry []byte, v int64) error {
	// Into the prefetched value's frame directly, inlined like GetInt64's fast path. Its cap is
	// always at least abi.FrameMinCap (loadFrames checked it, and that the frame lies in the
	// input buffer), so 8 bytes fit.
	if h := s.frame; h != nil && len(entry) == 0 {
		abi.Store64(unsafe.Add(h, abi.FrameHeader), uint64(v))
		abi.Store32(h, 8)
		abi.Or32(unsafe.Add(h, 8), abi.FrameDirty)
		return nil
	}
	return s.putInt64(entry, v)
}

// putInt64 is PutInt64 through the put import.
func (s *State) putInt64(entry []byte, v int64) error {
	var b [8]byte
	PutInt64(b[:], v)
	return s.Put(entry, b[:])
}

// Int64 decodes the first 8 bytes of b as a little-endian int64, the layout of PutInt64. It
// spares operators encoding/binary, which links reflect into the module (about 300 KB).
func Int64(b []byte) int64 {
	_ = b[7]
	return int64(uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56)
}

// PutInt64 encodes v into the first 8 bytes of b, little-endian.
func PutInt64(b []byte, v int64) {
	_ = b[7]
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	b[4], b[5], b[6], b[7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
}

// frameBytes returns the state's frame, header and value area, as a slice of the input
// buffer. loadFrames checked that it lies in the buffer.
func (s *State) frameBytes() []byte {
	return unsafe.Slice((*byte)(s.frame), abi.FrameHeader+abi.Load32(unsafe.Add(s.frame, 4)))
}

// frameValue returns the value in the state's frame, a view of the input buffer. The caller
// checked that the value is in the frame (len is not FrameTooLarge).
func (s *State) frameValue() (value []byte, found bool, err error) {
	h := s.frameBytes()
	n := abi.Le32(h)
	if n == abi.FrameAbsent {
		return nil, false, nil
	}
	// loadFrames checked the host's len against cap, and writeFrame keeps len <= cap.
	return h[abi.FrameHeader : abi.FrameHeader+n], true, nil
}

// putFrame writes value to the state's frame if it fits, and otherwise with the put import.
func (s *State) putFrame(value []byte) error {
	h := s.frameBytes()
	if uint64(len(value)) <= uint64(abi.Le32(h[4:])) {
		s.writeFrame(uint32(len(value)), value)
		return nil
	}
	// Too large for the frame (docs/abi.md: such a value must be written with put, and the
	// frame must then stay un-DIRTY, or the write-back would overwrite the put). A failed
	// put changes nothing: the frame keeps the call's earlier write, if any.
	if rc := abi.Put(s.index, nil, 0, abi.Ptr(value), uint32(len(value))); rc < 0 {
		return codeErr("put "+s.name, int64(rc))
	}
	abi.PutLe32(h[8:], abi.Le32(h[8:])&^abi.FrameDirty)
	abi.PutLe32(h, abi.FrameTooLarge) // the value is not in the frame: reads use get_async
	return nil
}

// writeFrame sets the frame's value (n = FrameAbsent deletes it) and marks it DIRTY.
func (s *State) writeFrame(n uint32, value []byte) {
	h := s.frameBytes()
	copy(h[abi.FrameHeader:], value)
	abi.PutLe32(h, n)
	abi.PutLe32(h[8:], abi.Le32(h[8:])|abi.FrameDirty)
}

// loadFrames locates the frames of the prefetched states in the input buffer, starting at off
// (docs/abi.md, "Prefetched values"), and checks what the host wrote. A malformed frame most
// likely means a host that does not know the manifest's prefetch field.
func loadFrames(off uint32) error {
	in := abi.Input
	o := uint64(off)
	for _, s := range prefetched {
		if o+abi.FrameHeader > uint64(len(in)) {
			return frameError(s, "its frame lies outside the input buffer")
		}
		h := abi.At(in, uint32(o)) // the header lies in the buffer: checked just above
		n, c := abi.Load32(h), abi.Load32(unsafe.Add(h, 4))
		switch {
		case c < abi.FrameMinCap || c%8 != 0 || o+abi.FrameHeader+uint64(c) > uint64(len(in)):
			return frameError(s, "its frame has an invalid cap")
		case n != abi.FrameAbsent && n != abi.FrameTooLarge && n > c:
			return frameError(s, "its frame has len > cap")
		}
		s.frame = h
		o += abi.FrameHeader + uint64(c)
	}
	return nil
}

func frameError(s *State, what string) error {
	return errors.New("clink: prefetched state " + strconv.Quote(s.name) + ": " + what +
		" (does the host support the manifest's prefetch field? docs/abi.md, \"Prefetched values\")")
}

// endFrames closes the frames of the call that is returning: they belong to the host again.
func endFrames() {
	for _, s := range prefetched {
		s.frame = nil
	}
}
