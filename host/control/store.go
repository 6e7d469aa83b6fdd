package control

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/clink-wasm/clink-wasm/internal/objstore"
)

// ObjectStore is the little an object store must do for the control plane: whole-object reads
// and writes, where a write can be conditional on the object's current generation. That is
// exactly what S3 offers with If-None-Match: * and If-Match: <etag>, and what a local directory
// offers with write-temp-then-rename under a lock.
//
// A generation is an opaque string that changes with every write of a name (an ETag on S3, a
// content hash on file://). The empty generation means "the object does not exist".
type ObjectStore interface {
	// Get returns the object's bytes and generation, or an error wrapping ErrNotFound.
	Get(ctx context.Context, name string) ([]byte, string, error)
	// Put writes the object if its current generation is ifGen ("" = only if absent) and
	// returns the new generation. A failed condition is an error wrapping ErrConflict.
	Put(ctx context.Context, name string, data []byte, ifGen string) (string, error)
	// PutImmutable writes an object whose name is derived from its content (a module blob):
	// writing it again with the same bytes succeeds and changes nothing.
	PutImmutable(ctx context.Context, name string, data []byte) error
	// Delete removes the object; a missing object is not an error.
	Delete(ctx context.Context, name string) error
	Close() error
}

var (
	// ErrNotFound: the object or record does not exist. It is internal/objstore's sentinel, so
	// a missing object matches it whichever layer reports it.
	ErrNotFound = objstore.ErrNotFound
	// ErrConflict: a conditional write lost against another writer, or a record that must be
	// unique exists already.
	ErrConflict = errors.New("conflict")
)

// StoreError is a failed object-store operation. Retryable tells whether trying again may help.
type StoreError struct {
	Op, Object string
	Retryable  bool
	Err        error
}

func (e *StoreError) Error() string {
	return fmt.Sprintf("control store: %s %s: %v", e.Op, e.Object, e.Err)
}
func (e *StoreError) Unwrap() error { return e.Err }

// IsRetryable reports whether err is a store failure that may clear when tried again.
func IsRetryable(err error) bool {
	var se *StoreError
	return errors.As(err, &se) && se.Retryable
}

// OpenStore opens the object store a URL names: file:///abs/dir, a bare directory path, or
// s3://bucket/prefix[?endpoint=URL&region=R&path_style=true] (the parameters override s3).
func OpenStore(ctx context.Context, rawURL string, s3 S3Options) (ObjectStore, error) {
	if !strings.Contains(rawURL, "://") {
		abs, err := filepath.Abs(rawURL)
		if err != nil {
			return nil, err
		}
		return OpenFileStore(abs)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("control: bad data URL %q: %w", rawURL, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("control: file URL %q names a host; use file:///absolute/path", rawURL)
		}
		return OpenFileStore(u.Path)
	case "s3":
		// The same query parameters as the state tier's s3:// URLs.
		for k, v := range u.Query() {
			switch k {
			case "endpoint":
				s3.Endpoint = v[0]
			case "region":
				s3.Region = v[0]
			case "path_style":
				s3.PathStyle = v[0] == "true" || v[0] == "1"
			default:
				return nil, fmt.Errorf("control: unknown s3 URL parameter %q (known: endpoint, region, path_style)", k)
			}
		}
		return OpenS3Store(ctx, u.Host, strings.Trim(u.Path, "/"), s3)
	default:
		return nil, fmt.Errorf("control: unsupported data URL scheme %q (use file:// or s3://)", u.Scheme)
	}
}

// FileStore keeps one file per object under a root directory: internal/objstore's file pool,
// private (directories 0700, files 0600) and fsync'd. Every write is write-temp, fsync, rename
// (or link(2) for a create), fsync of the directory, so a crash leaves the old object or the
// new one, never a torn one. Conditional replaces are serialised by a process mutex plus
// flock(2) on <root>/.lock, which also fences a second server process on the same directory.
type FileStore struct{ store }

// OpenFileStore opens (creating) a file store rooted at the absolute directory root.
func OpenFileStore(root string) (*FileStore, error) {
	if root == "" || !filepath.IsAbs(root) {
		return nil, fmt.Errorf("control: file store needs an absolute path, got %q", root)
	}
	st, err := objstore.OpenFile(root, objstore.FileOptions{Fsync: true, Private: true})
	if err != nil {
		return nil, storeErr(err)
	}
	return &FileStore{store{st}}, nil
}

// pool is an objstore pool that measures usage (the file and the S3 pools both do).
type pool interface {
	objstore.Store
	Usage(ctx context.Context, prefix string) (bytes, objects int64, err error)
}

// store adapts an objstore pool to ObjectStore and UsageStore: a generation is the pool's ETag,
// a failed condition is ErrConflict, and pool errors become *StoreError.
type store struct{ p pool }

// storeErr carries a pool failure over as a *StoreError with the same operation, object,
// retryability and cause.
func storeErr(err error) error {
	if e, ok := err.(*objstore.Error); ok {
		return &StoreError{Op: e.Op, Object: e.Object, Retryable: e.Retryable, Err: e.Err}
	}
	return err
}

// Get implements ObjectStore.
func (s store) Get(ctx context.Context, name string) ([]byte, string, error) {
	if err := objstore.ValidName(name); err != nil {
		return nil, "", err
	}
	b, gen, err := s.p.Read(ctx, name)
	if err != nil {
		return nil, "", storeErr(err)
	}
	return b, gen, nil
}

// Put implements ObjectStore.
func (s store) Put(ctx context.Context, name string, data []byte, ifGen string) (string, error) {
	if err := objstore.ValidName(name); err != nil {
		return "", err
	}
	gen, err := s.p.Put(ctx, name, data, objstore.Cond{IfAbsent: ifGen == "", IfMatch: ifGen})
	switch {
	case err == nil:
		return gen, nil
	case errors.Is(err, objstore.ErrPrecondition) && ifGen == "":
		return "", &StoreError{Op: "put", Object: name, Err: fmt.Errorf("%w: object exists", ErrConflict)}
	case errors.Is(err, objstore.ErrPrecondition), ifGen != "" && errors.Is(err, ErrNotFound):
		// If-Match on an object that changed, or that another writer deleted.
		return "", &StoreError{Op: "put", Object: name, Err: fmt.Errorf("%w: object changed or is gone (expected generation %s)", ErrConflict, ifGen)}
	}
	return "", storeErr(err)
}

// PutImmutable implements ObjectStore: an unconditional write, so writing the same bytes again
// succeeds and leaves the same object (and, on file://, the same generation).
func (s store) PutImmutable(ctx context.Context, name string, data []byte) error {
	if err := objstore.ValidName(name); err != nil {
		return err
	}
	_, err := s.p.Put(ctx, name, data, objstore.Cond{})
	return storeErr(err)
}

// Delete implements ObjectStore.
func (s store) Delete(ctx context.Context, name string) error {
	if err := objstore.ValidName(name); err != nil {
		return err
	}
	return storeErr(s.p.Delete(ctx, name))
}

// Usage implements UsageStore.
func (s store) Usage(ctx context.Context, prefix string) (int64, int64, error) {
	n, objs, err := s.p.Usage(ctx, prefix)
	return n, objs, storeErr(err)
}

// Close implements ObjectStore.
func (s store) Close() error { return s.p.Close() }
