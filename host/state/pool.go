package state

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/internal/objstore"
)

// objectStore is the durable tier as the backends see it: a flat namespace of immutable-ish
// objects with ranged reads and two kinds of conditional create. Names use '/' separators and
// are relative to the pool root (the file directory or the S3 prefix). The pools themselves
// (mem, file, s3) are internal/objstore's; metered adapts one to this interface.
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
var errPrecondition = objstore.ErrPrecondition

// metered adapts an objstore pool to objectStore: it counts requests, bytes and latency into m
// and turns the pool's errors into this package's *Error.
type metered struct {
	st objstore.Store
	m  *remoteMetrics
}

type remoteMetrics struct {
	gets, puts, lists, deletes atomic.Int64
	getBytes, putBytes         atomic.Int64
	getNanos, putNanos         atomic.Int64
	errors                     atomic.Int64
}

// poolErr carries a pool failure over as an *Error with the same operation, object,
// retryability and cause. ErrNotFound is the pool's own sentinel, so errors.Is still holds.
func poolErr(err error) error {
	if e, ok := err.(*objstore.Error); ok {
		return &Error{Op: e.Op, Object: e.Object, Retryable: e.Retryable, Err: e.Err}
	}
	return err
}

func (s metered) get(ctx context.Context, name string, off, n int64) ([]byte, error) {
	t := time.Now()
	b, err := s.st.Get(ctx, name, off, n)
	s.m.gets.Add(1)
	s.m.getBytes.Add(int64(len(b)))
	s.m.getNanos.Add(int64(time.Since(t)))
	if err != nil {
		s.m.errors.Add(1)
	}
	return b, poolErr(err)
}

func (s metered) put(ctx context.Context, name string, data []byte, c putCond) (string, error) {
	t := time.Now()
	e, err := s.st.Put(ctx, name, data, objstore.Cond{IfAbsent: c.ifAbsent, IfMatch: c.ifMatch})
	s.m.puts.Add(1)
	s.m.putBytes.Add(int64(len(data)))
	s.m.putNanos.Add(int64(time.Since(t)))
	if err != nil && !errors.Is(err, errPrecondition) {
		s.m.errors.Add(1)
	}
	return e, poolErr(err)
}

func (s metered) head(ctx context.Context, name string) (objectInfo, error) {
	in, err := s.st.Head(ctx, name)
	return objectInfo{name: in.Name, size: in.Size, modTime: in.ModTime, etag: in.ETag}, poolErr(err)
}

func (s metered) list(ctx context.Context, prefix string) ([]objectInfo, error) {
	s.m.lists.Add(1)
	ins, err := s.st.List(ctx, prefix)
	if err != nil {
		return nil, poolErr(err)
	}
	out := make([]objectInfo, len(ins))
	for i, in := range ins {
		out[i] = objectInfo{name: in.Name, size: in.Size, modTime: in.ModTime, etag: in.ETag}
	}
	return out, nil
}

func (s metered) del(ctx context.Context, name string) error {
	s.m.deletes.Add(1)
	return poolErr(s.st.Delete(ctx, name))
}

func (s metered) close() error { return s.st.Close() }

// openPool opens the objstore pool u names, configured by cfg.
func openPool(ctx context.Context, u *url.URL, cfg *config) (objstore.Store, error) {
	switch u.Scheme {
	case "mem":
		return objstore.OpenMem(u.Host + u.Path), nil
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("state: file URL must be file:///abs/path, got %q", u.Redacted())
		}
		o := objstore.FileOptions{Fsync: cfg.fsync, MaxOpenFiles: cfg.maxOpenFiles, ImmutableSuffix: segSuffix}
		if cfg.useUring {
			r, err := objstore.NewUringReader()
			if err != nil {
				return nil, err
			}
			o.Reader = r
		}
		fs, err := objstore.OpenFile(u.Path, o)
		if err != nil {
			if o.Reader != nil {
				o.Reader.Close()
			}
			return nil, poolErr(err)
		}
		return fs, nil
	case "s3":
		st, err := objstore.OpenS3(ctx, u.Host, strings.Trim(u.Path, "/"), cfg.s3)
		if err != nil {
			return nil, poolErr(err)
		}
		return st, nil
	default:
		return nil, fmt.Errorf("state: unknown pool scheme %q (want mem, file or s3)", u.Scheme)
	}
}
