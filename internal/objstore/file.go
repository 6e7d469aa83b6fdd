package objstore

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// FileOptions configures a file pool.
type FileOptions struct {
	// Fsync makes every write durable before it returns (file, then directory). Off is only
	// for tests and benchmarks.
	Fsync bool
	// Private creates directories 0700 and files 0600 instead of 0755 and 0644 (the control
	// plane's catalog holds token hashes and secrets).
	Private bool
	// ImmutableSuffix names the objects that are never rewritten in place (host/state's
	// segments, ".seg"): their reads go through a cache of open files. "" caches nothing.
	ImmutableSuffix string
	// MaxOpenFiles bounds that cache. Default 256.
	MaxOpenFiles int
	// Reader, when set, serves the ranged reads of immutable objects (NewUringReader). The
	// pool closes it.
	Reader BlockReader
}

// File is the file pool: one file per object under a root directory. Every Put is write-temp,
// fsync, rename (or link(2), for a create-only Put), fsync of the directory, so a crash leaves
// either the old object or the new one. Replaces conditional on an ETag are serialised by a
// process mutex plus flock(2) on <root>/.lock, which also fences other processes on the host;
// a wait for that lock ends with the put's context.
type File struct {
	root              string
	opt               FileOptions
	dirPerm, filePerm os.FileMode
	files             *fileCache
	cas               chan struct{} // a token: serialises IfMatch puts in this process; flock covers other processes
}

// BlockReader reads n bytes at off of an open file (an io_uring ring, for example).
type BlockReader interface {
	ReadAt(f *os.File, off, n int64) ([]byte, error)
	Close() error
}

// OpenFile opens (creating) the file pool rooted at the absolute directory root.
func OpenFile(root string, o FileOptions) (*File, error) {
	if root == "" || !filepath.IsAbs(root) {
		return nil, fmt.Errorf("objstore: file pool needs an absolute path, got %q", root)
	}
	if o.MaxOpenFiles <= 0 {
		o.MaxOpenFiles = 256
	}
	s := &File{root: root, opt: o, dirPerm: 0o755, filePerm: 0o644, files: newFileCache(o.MaxOpenFiles), cas: make(chan struct{}, 1)}
	if o.Private {
		s.dirPerm, s.filePerm = 0o700, 0o600
	}
	if err := os.MkdirAll(root, s.dirPerm); err != nil {
		return nil, &Error{Op: "open", Object: root, Err: err}
	}
	return s, nil
}

func (s *File) path(name string) (string, error) {
	if err := ValidName(name); err != nil {
		return "", err
	}
	return filepath.Join(s.root, filepath.FromSlash(name)), nil
}

func fileErr(op, name string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return &Error{Op: op, Object: name, Err: ErrNotFound}
	}
	// Local IO errors (EIO, ENOSPC) may clear; let the caller's retry policy decide.
	return &Error{Op: op, Object: name, Retryable: true, Err: err}
}

// Get implements Store.
func (s *File) Get(ctx context.Context, name string, off, n int64) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := s.path(name)
	if err != nil {
		return nil, err
	}
	// Immutable objects (segments) go through the open-file cache; others are opened per read.
	if s.opt.ImmutableSuffix != "" && strings.HasSuffix(name, s.opt.ImmutableSuffix) {
		h, err := s.files.open(p)
		if err != nil {
			return nil, fileErr("get", name, err)
		}
		defer s.files.release(h)
		return s.readAt(h.f, h.size, name, off, n)
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, fileErr("get", name, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fileErr("get", name, err)
	}
	return s.readAt(f, st.Size(), name, off, n)
}

func (s *File) readAt(f *os.File, size int64, name string, off, n int64) ([]byte, error) {
	if off < 0 || off > size {
		return nil, &Error{Op: "get", Object: name, Err: errors.New("range out of bounds")}
	}
	if n < 0 || off+n > size {
		n = size - off
	}
	if s.opt.Reader != nil {
		b, err := s.opt.Reader.ReadAt(f, off, n)
		if err != nil {
			return nil, fileErr("get", name, err)
		}
		return b, nil
	}
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil && !(errors.Is(err, io.EOF) && n == 0) {
		return nil, fileErr("get", name, err)
	}
	return b, nil
}

// Read implements Store: the ETag is the hash of the bytes read.
func (s *File) Read(ctx context.Context, name string) ([]byte, string, error) {
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
	return b, ETagOf(b), nil
}

// Put implements Store.
func (s *File) Put(ctx context.Context, name string, data []byte, c Cond) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	p, err := s.path(name)
	if err != nil {
		return "", err
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, s.dirPerm); err != nil {
		return "", fileErr("put", name, err)
	}
	tmp, err := s.writeTemp(dir, data)
	if err != nil {
		return "", fileErr("put", name, err)
	}
	defer os.Remove(tmp) // no-op once renamed or linked
	switch {
	case c.IfAbsent:
		// link(2) fails with EEXIST if the name exists: an atomic create-only.
		if err := os.Link(tmp, p); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return "", ErrPrecondition
			}
			return "", fileErr("put", name, err)
		}
	case c.IfMatch != "":
		if err := s.replaceIfMatch(ctx, tmp, p, c.IfMatch); err != nil {
			if errors.Is(err, ErrPrecondition) {
				return "", err
			}
			return "", fileErr("put", name, err)
		}
	default:
		if err := os.Rename(tmp, p); err != nil {
			return "", fileErr("put", name, err)
		}
	}
	if err := s.syncDir(dir); err != nil {
		return "", fileErr("put", name, err)
	}
	return ETagOf(data), nil
}

func (s *File) writeTemp(dir string, data []byte) (string, error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, ".tmp-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, s.filePerm)
	if err != nil {
		return "", err
	}
	_, err = f.Write(data)
	if err == nil && s.opt.Fsync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

func (s *File) syncDir(dir string) error {
	if !s.opt.Fsync {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// replaceIfMatch renames tmp over p if p's ETag is etag, holding the pool's lock for the
// check and the rename only (the directory's fsync comes after it: a writer that takes the
// lock next sees the rename whether or not it is durable yet, and neither put has returned).
// A process stopped (SIGSTOP) inside that section holds the lock until it resumes or exits;
// the waiters wait for as long as their contexts allow, not longer.
func (s *File) replaceIfMatch(ctx context.Context, tmp, p, etag string) error {
	unlock, err := s.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	cur, err := os.ReadFile(p)
	if err != nil || ETagOf(cur) != etag {
		return ErrPrecondition
	}
	return os.Rename(tmp, p)
}

// lockPoll bounds the wait between two tries of a lock another process holds.
const lockPoll = 20 * time.Millisecond

// lock takes the pool's lock: the process mutex, then flock(2) on <root>/.lock, which other
// processes (and other File values on the same root) contend for. It tries the flock without
// blocking and, while another holds it, again after a short wait, so that ctx ends the wait:
// a blocking flock could not be cancelled.
func (s *File) lock(ctx context.Context) (func(), error) {
	select {
	case s.cas <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the pool's lock: %w", context.Cause(ctx))
	}
	f, err := os.OpenFile(filepath.Join(s.root, ".lock"), os.O_RDWR|os.O_CREATE, s.filePerm)
	if err != nil {
		<-s.cas
		return nil, err
	}
	fail := func(err error) (func(), error) {
		f.Close()
		<-s.cas
		return nil, err
	}
	for wait := time.Millisecond; ; wait = min(2*wait, lockPoll) {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return fail(err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fail(fmt.Errorf("waiting for %s, which another process holds: %w", f.Name(), context.Cause(ctx)))
		case <-t.C:
		}
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
		<-s.cas
	}, nil
}

// Head implements Store.
func (s *File) Head(ctx context.Context, name string) (Info, error) {
	p, err := s.path(name)
	if err != nil {
		return Info{}, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return Info{}, fileErr("head", name, err)
	}
	st, err := os.Stat(p)
	if err != nil {
		return Info{}, fileErr("head", name, err)
	}
	return Info{Name: name, Size: int64(len(b)), ModTime: st.ModTime(), ETag: ETagOf(b)}, nil
}

// List implements Store. Temporaries and the lock file are not objects and are not listed.
func (s *File) List(ctx context.Context, prefix string) ([]Info, error) {
	var out []Info
	err := s.walk(prefix, func(name string, info fs.FileInfo) {
		if !strings.HasPrefix(info.Name(), ".") && strings.HasPrefix(name, prefix) {
			out = append(out, Info{Name: name, Size: info.Size(), ModTime: info.ModTime()})
		}
	})
	if err != nil {
		return nil, fileErr("list", prefix, err)
	}
	return out, nil
}

// walk calls fn for every regular file in the deepest directory named by prefix, with its name
// relative to the root. Files removed while it walks are skipped.
func (s *File) walk(prefix string, fn func(name string, info fs.FileInfo)) error {
	dirPart := ""
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		dirPart = prefix[:i]
	}
	start := filepath.Join(s.root, filepath.FromSlash(dirPart))
	return filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(s.root, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		fn(filepath.ToSlash(rel), info)
		return nil
	})
}

// Usage returns the bytes and the number of files under the directory prefix names
// ("state/acme/"), temporaries included: they occupy the disk too. A missing directory is 0.
func (s *File) Usage(ctx context.Context, prefix string) (bytes, objects int64, err error) {
	if err := ValidName(strings.TrimSuffix(prefix, "/")); err != nil {
		return 0, 0, err
	}
	dir := strings.TrimSuffix(prefix, "/") + "/"
	err = s.walk(dir, func(name string, info fs.FileInfo) {
		if strings.HasPrefix(name, dir) {
			bytes += info.Size()
			objects++
		}
	})
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return 0, 0, fileErr("usage", prefix, err)
	}
	return bytes, objects, nil
}

// Delete implements Store.
func (s *File) Delete(ctx context.Context, name string) error {
	p, err := s.path(name)
	if err != nil {
		return err
	}
	s.files.evict(p)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fileErr("delete", name, err)
	}
	return nil
}

// Close implements Store: it closes the cached files and the block reader.
func (s *File) Close() error {
	err := s.files.closeAll()
	if s.opt.Reader != nil {
		if rerr := s.opt.Reader.Close(); err == nil {
			err = rerr
		}
	}
	return err
}

// fileCache keeps up to max immutable files open, LRU, reference counted so an eviction never
// closes a file under a concurrent read.
type fileCache struct {
	max int
	mu  sync.Mutex
	m   map[string]*openFile
	lru list.List // of *openFile, front = most recent
}

type openFile struct {
	path string
	f    *os.File
	size int64
	refs int // guarded by fileCache.mu
	gone bool
	elem *list.Element
}

func newFileCache(max int) *fileCache { return &fileCache{max: max, m: map[string]*openFile{}} }

func (c *fileCache) open(p string) (*openFile, error) {
	c.mu.Lock()
	if h, ok := c.m[p]; ok {
		h.refs++
		c.lru.MoveToFront(h.elem)
		c.mu.Unlock()
		return h, nil
	}
	c.mu.Unlock()
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if h, ok := c.m[p]; ok { // lost a race: use the cached one
		f.Close()
		h.refs++
		c.lru.MoveToFront(h.elem)
		return h, nil
	}
	h := &openFile{path: p, f: f, size: st.Size(), refs: 1}
	h.elem = c.lru.PushFront(h)
	c.m[p] = h
	for c.lru.Len() > c.max {
		c.dropLocked(c.lru.Back().Value.(*openFile))
	}
	return h, nil
}

func (c *fileCache) dropLocked(h *openFile) {
	c.lru.Remove(h.elem)
	delete(c.m, h.path)
	h.gone = true
	if h.refs == 0 {
		h.f.Close()
	}
}

func (c *fileCache) release(h *openFile) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h.refs--
	if h.refs == 0 && h.gone {
		h.f.Close()
	}
}

func (c *fileCache) evict(p string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h, ok := c.m[p]; ok {
		c.dropLocked(h)
	}
}

func (c *fileCache) closeAll() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range c.m {
		c.dropLocked(h)
	}
	return nil
}
