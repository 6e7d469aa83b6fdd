package objstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Mem is the in-memory pool. Pools opened with a name are registered process-wide, so opening
// the same name again sees the same objects (restore tests); a pool without a name is private.
type Mem struct {
	mu struct {
		sync.Mutex
		objs map[string]memObject
		seq  uint64
	}
}

type memObject struct {
	data    []byte
	modTime time.Time
	etag    string
}

var memRegistry = struct {
	sync.Mutex
	m map[string]*Mem
}{m: map[string]*Mem{}}

// OpenMem returns the process-wide pool called name, creating it; "" returns a new private one.
func OpenMem(name string) *Mem {
	if name == "" {
		return NewMem()
	}
	memRegistry.Lock()
	defer memRegistry.Unlock()
	s, ok := memRegistry.m[name]
	if !ok {
		s = NewMem()
		memRegistry.m[name] = s
	}
	return s
}

// NewMem returns a new private in-memory pool.
func NewMem() *Mem {
	s := &Mem{}
	s.mu.objs = map[string]memObject{}
	return s
}

// Get implements Store.
func (s *Mem) Get(ctx context.Context, name string, off, n int64) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	o, ok := s.mu.objs[name]
	s.mu.Unlock()
	if !ok {
		return nil, &Error{Op: "get", Object: name, Err: ErrNotFound}
	}
	if off < 0 || off > int64(len(o.data)) {
		return nil, &Error{Op: "get", Object: name, Err: errors.New("range out of bounds")}
	}
	end := int64(len(o.data))
	if n >= 0 && off+n < end {
		end = off + n
	}
	return append([]byte(nil), o.data[off:end]...), nil
}

// Read implements Store.
func (s *Mem) Read(ctx context.Context, name string) ([]byte, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	s.mu.Lock()
	o, ok := s.mu.objs[name]
	s.mu.Unlock()
	if !ok {
		return nil, "", &Error{Op: "get", Object: name, Err: ErrNotFound}
	}
	return append([]byte(nil), o.data...), o.etag, nil
}

// Put implements Store.
func (s *Mem) Put(ctx context.Context, name string, data []byte, c Cond) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if err := ValidName(name); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, exists := s.mu.objs[name]
	if c.IfAbsent && exists || c.IfMatch != "" && (!exists || old.etag != c.IfMatch) {
		return "", ErrPrecondition
	}
	s.mu.seq++
	etag := "m" + strconv.FormatUint(s.mu.seq, 10)
	s.mu.objs[name] = memObject{data: append([]byte(nil), data...), modTime: time.Now(), etag: etag}
	return etag, nil
}

// Head implements Store.
func (s *Mem) Head(ctx context.Context, name string) (Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.mu.objs[name]
	if !ok {
		return Info{}, &Error{Op: "head", Object: name, Err: ErrNotFound}
	}
	return Info{Name: name, Size: int64(len(o.data)), ModTime: o.modTime, ETag: o.etag}, nil
}

// List implements Store.
func (s *Mem) List(ctx context.Context, prefix string) ([]Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Info
	for n, o := range s.mu.objs {
		if strings.HasPrefix(n, prefix) {
			out = append(out, Info{Name: n, Size: int64(len(o.data)), ModTime: o.modTime, ETag: o.etag})
		}
	}
	return out, nil
}

// Delete implements Store.
func (s *Mem) Delete(ctx context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mu.objs, name)
	return nil
}

// Close implements Store; the objects stay (a named pool outlives its users).
func (s *Mem) Close() error { return nil }

// Corrupt flips a byte of an object, for tests of corruption detection. It reports whether the
// object has that byte.
func (s *Mem) Corrupt(name string, off int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.mu.objs[name]
	if !ok || off >= len(o.data) {
		return false
	}
	o.data[off] ^= 0xff
	return true
}
