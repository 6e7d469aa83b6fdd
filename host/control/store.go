package control

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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
	// ErrNotFound: the object or record does not exist.
	ErrNotFound = errors.New("not found")
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

// FileStore keeps one file per object under a root directory. Every write is write-temp, fsync,
// rename, fsync of the directory, so a crash leaves the old object or the new one, never a torn
// one. Conditional writes are serialised by a process mutex plus flock(2) on <root>/.lock, which
// also fences a second server process started on the same directory.
type FileStore struct {
	root string
	mu   sync.Mutex
}

// OpenFileStore opens (creating) a file store rooted at the absolute directory root.
func OpenFileStore(root string) (*FileStore, error) {
	if root == "" || !filepath.IsAbs(root) {
		return nil, fmt.Errorf("control: file store needs an absolute path, got %q", root)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, &StoreError{Op: "open", Object: root, Err: err}
	}
	return &FileStore{root: root}, nil
}

// validObjectName refuses names that could leave the root or collide with temporaries.
func validObjectName(name string) error {
	if name == "" || strings.HasPrefix(name, "/") || strings.Contains(name, "\\") || strings.ContainsRune(name, 0) {
		return fmt.Errorf("control: bad object name %q", name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == "" || part == "." || part == ".." || strings.HasPrefix(part, ".") {
			return fmt.Errorf("control: bad object name %q", name)
		}
	}
	return nil
}

func (s *FileStore) path(name string) (string, error) {
	if err := validObjectName(name); err != nil {
		return "", err
	}
	return filepath.Join(s.root, filepath.FromSlash(name)), nil
}

func fileErr(op, name string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return &StoreError{Op: op, Object: name, Err: ErrNotFound}
	}
	return &StoreError{Op: op, Object: name, Retryable: true, Err: err}
}

func generationOf(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:16])
}

// Get implements ObjectStore.
func (s *FileStore) Get(ctx context.Context, name string) ([]byte, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	p, err := s.path(name)
	if err != nil {
		return nil, "", err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, "", fileErr("get", name, err)
	}
	return b, generationOf(b), nil
}

// Put implements ObjectStore.
func (s *FileStore) Put(ctx context.Context, name string, data []byte, ifGen string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	p, err := s.path(name)
	if err != nil {
		return "", err
	}
	unlock, err := s.lock()
	if err != nil {
		return "", fileErr("put", name, err)
	}
	defer unlock()
	cur, err := os.ReadFile(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if ifGen != "" {
			return "", &StoreError{Op: "put", Object: name, Err: fmt.Errorf("%w: object is gone (expected generation %s)", ErrConflict, ifGen)}
		}
	case err != nil:
		return "", fileErr("put", name, err)
	default:
		if g := generationOf(cur); g != ifGen {
			return "", &StoreError{Op: "put", Object: name, Err: fmt.Errorf("%w: generation is %s, expected %q", ErrConflict, g, ifGen)}
		}
	}
	if err := s.replace(p, data); err != nil {
		return "", fileErr("put", name, err)
	}
	return generationOf(data), nil
}

// PutImmutable implements ObjectStore.
func (s *FileStore) PutImmutable(ctx context.Context, name string, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := s.path(name)
	if err != nil {
		return err
	}
	if cur, err := os.ReadFile(p); err == nil && generationOf(cur) == generationOf(data) {
		return nil
	}
	if err := s.replace(p, data); err != nil {
		return fileErr("put", name, err)
	}
	return nil
}

// Delete implements ObjectStore.
func (s *FileStore) Delete(ctx context.Context, name string) error {
	p, err := s.path(name)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fileErr("delete", name, err)
	}
	return nil
}

// Close implements ObjectStore.
func (s *FileStore) Close() error { return nil }

// replace writes data to p atomically: a temporary in the same directory, fsync, rename, fsync
// of the directory.
func (s *FileStore) replace(p string, data []byte) error {
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, ".tmp-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // a no-op once renamed
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (s *FileStore) lock() (func(), error) {
	s.mu.Lock()
	f, err := os.OpenFile(filepath.Join(s.root, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		s.mu.Unlock()
		return nil, err
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
		s.mu.Unlock()
	}, nil
}
