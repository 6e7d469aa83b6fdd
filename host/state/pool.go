package state

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// objectStore is the durable tier as the backends see it: a flat namespace of immutable-ish
// objects with ranged reads and two kinds of conditional create. Names use '/' separators and
// are relative to the pool root (the file directory or the S3 prefix).
type objectStore interface {
	// get reads n bytes at off (n < 0: to the end). A missing object is ErrNotFound.
	get(ctx context.Context, name string, off, n int64) ([]byte, error)
	// put writes a whole object atomically: readers see the old object or the new one, never
	// a torn one. It returns the new object's etag. A failed condition is errPrecondition.
	put(ctx context.Context, name string, data []byte, c putCond) (etag string, err error)
	// head returns the object's etag and size (ErrNotFound when missing).
	head(ctx context.Context, name string) (objectInfo, error)
	// list returns every object whose name starts with prefix, in no particular order.
	list(ctx context.Context, prefix string) ([]objectInfo, error)
	// del removes an object; removing a missing object is not an error.
	del(ctx context.Context, name string) error
	close() error
}

// putCond makes a put conditional: ifAbsent creates only a new object (S3 If-None-Match: *);
// ifMatch replaces only the object with that etag (S3 If-Match).
type putCond struct {
	ifAbsent bool
	ifMatch  string
}

type objectInfo struct {
	name    string
	size    int64
	modTime time.Time
	etag    string
}

// errPrecondition is a failed conditional put; callers turn it into ErrFenced.
var errPrecondition = errors.New("state: precondition failed")

// metered wraps an objectStore, counting requests, bytes and latency into m.
type metered struct {
	objectStore
	m *remoteMetrics
}

type remoteMetrics struct {
	gets, puts, lists, deletes atomic.Int64
	getBytes, putBytes         atomic.Int64
	getNanos, putNanos         atomic.Int64
	errors                     atomic.Int64
}

func (s metered) get(ctx context.Context, name string, off, n int64) ([]byte, error) {
	t := time.Now()
	b, err := s.objectStore.get(ctx, name, off, n)
	s.m.gets.Add(1)
	s.m.getBytes.Add(int64(len(b)))
	s.m.getNanos.Add(int64(time.Since(t)))
	if err != nil {
		s.m.errors.Add(1)
	}
	return b, err
}

func (s metered) put(ctx context.Context, name string, data []byte, c putCond) (string, error) {
	t := time.Now()
	e, err := s.objectStore.put(ctx, name, data, c)
	s.m.puts.Add(1)
	s.m.putBytes.Add(int64(len(data)))
	s.m.putNanos.Add(int64(time.Since(t)))
	if err != nil && !errors.Is(err, errPrecondition) {
		s.m.errors.Add(1)
	}
	return e, err
}

func (s metered) list(ctx context.Context, prefix string) ([]objectInfo, error) {
	s.m.lists.Add(1)
	return s.objectStore.list(ctx, prefix)
}

func (s metered) del(ctx context.Context, name string) error {
	s.m.deletes.Add(1)
	return s.objectStore.del(ctx, name)
}

// memStore is the mem:// pool: objects in process memory. Pools with a host name are
// registered process-wide, so reopening mem://name sees the same objects (used by restore
// tests); mem:// without a name is private to its Store.
type memStore struct {
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
	m map[string]*memStore
}{m: map[string]*memStore{}}

func openMemStore(name string) *memStore {
	if name == "" {
		return newMemStore()
	}
	memRegistry.Lock()
	defer memRegistry.Unlock()
	s, ok := memRegistry.m[name]
	if !ok {
		s = newMemStore()
		memRegistry.m[name] = s
	}
	return s
}

func newMemStore() *memStore {
	s := &memStore{}
	s.mu.objs = map[string]memObject{}
	return s
}

func (s *memStore) get(ctx context.Context, name string, off, n int64) ([]byte, error) {
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

func (s *memStore) put(ctx context.Context, name string, data []byte, c putCond) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, exists := s.mu.objs[name]
	if c.ifAbsent && exists || c.ifMatch != "" && (!exists || old.etag != c.ifMatch) {
		return "", errPrecondition
	}
	s.mu.seq++
	etag := "m" + itoa(s.mu.seq)
	s.mu.objs[name] = memObject{data: append([]byte(nil), data...), modTime: time.Now(), etag: etag}
	return etag, nil
}

func (s *memStore) head(ctx context.Context, name string) (objectInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.mu.objs[name]
	if !ok {
		return objectInfo{}, &Error{Op: "head", Object: name, Err: ErrNotFound}
	}
	return objectInfo{name: name, size: int64(len(o.data)), modTime: o.modTime, etag: o.etag}, nil
}

func (s *memStore) list(ctx context.Context, prefix string) ([]objectInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []objectInfo
	for n, o := range s.mu.objs {
		if len(n) >= len(prefix) && n[:len(prefix)] == prefix {
			out = append(out, objectInfo{name: n, size: int64(len(o.data)), modTime: o.modTime, etag: o.etag})
		}
	}
	return out, nil
}

func (s *memStore) del(ctx context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mu.objs, name)
	return nil
}

func (s *memStore) close() error { return nil }

// corrupt flips a byte of an object (tests).
func (s *memStore) corrupt(name string, off int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.mu.objs[name]
	if !ok || off >= len(o.data) {
		return false
	}
	o.data[off] ^= 0xff
	return true
}

func itoa(v uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(b[i:])
		}
	}
}
