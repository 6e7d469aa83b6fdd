package clink

import "github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"

// State is a named keyed state: a map from entry (state key) to value, one map per record key.
// Inside a call for record key K, every method reads or writes K's map only. Use a nil entry for
// a plain per-key value, or distinct entries for a per-key map.
//
// Declare states as package-level variables so they exist before the manifest is produced:
//
//	var seen = clink.NewState("seen")
//
// State methods are allowed in Process and OnTimer only (ErrNotAllowed elsewhere).
type State struct {
	name  string
	index uint32
}

// NewState declares a state. name is what the host persists: 1-128 characters of
// [A-Za-z0-9_.-], unique within the module. It panics on an invalid or duplicate name, or when
// called after initialisation.
func NewState(name string) *State {
	return &State{name: name, index: uint32(declare("State", &stateNames, name, 256))}
}

// Name returns the state's name.
func (s *State) Name() string { return s.name }

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
	if rc := abi.Put(s.index, abi.Ptr(entry), uint32(len(entry)), abi.Ptr(value), uint32(len(value))); rc < 0 {
		return codeErr("put "+s.name, int64(rc))
	}
	return nil
}

// Delete removes entry from the current key's state. Deleting an absent entry succeeds.
func (s *State) Delete(entry []byte) error {
	if rc := abi.Delete(s.index, abi.Ptr(entry), uint32(len(entry))); rc < 0 {
		return codeErr("delete "+s.name, int64(rc))
	}
	return nil
}

// GetInt64 reads an entry written by PutInt64 (8 bytes, little-endian). found is false when the
// entry is absent (v is then 0). A value of another length is an ErrInvalidArgument error.
func (s *State) GetInt64(entry []byte) (v int64, found bool, err error) {
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
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}
