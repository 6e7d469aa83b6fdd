package state

import (
	"container/list"
	"context"
	"crypto/rand"
	"crypto/sha256"
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
)

// fileStore is the file:// pool: one file per object under a root directory. Every put is
// write-temp, fsync, rename (or link, for a create-only put), fsync of the directory, so a
// crash leaves either the old object or the new one. Conditional replaces are serialised by a
// process mutex plus flock(2) on <root>/.lock, which also fences other processes on the host.
type fileStore struct {
	root  string
	fsync bool
	files *fileCache
	// reader, when set, serves ranged reads of immutable objects (the io_uring path).
	reader blockReader

	casMu sync.Mutex // serialises ifMatch puts in this process; flock covers other processes
}

// blockReader reads n bytes at off of an open file.
type blockReader interface {
	readAt(f *os.File, off, n int64) ([]byte, error)
	close() error
}

func openFileStore(root string, fsync bool, maxOpenFiles int) (*fileStore, error) {
	if root == "" || !filepath.IsAbs(root) {
		return nil, fmt.Errorf("state: file pool needs an absolute path, got %q", root)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, &Error{Op: "open", Object: root, Err: err}
	}
	return &fileStore{root: root, fsync: fsync, files: newFileCache(maxOpenFiles)}, nil
}

func (s *fileStore) path(name string) (string, error) {
	if name == "" || strings.HasPrefix(name, "/") || strings.Contains(name, "\\") {
		return "", fmt.Errorf("state: bad object name %q", name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == "" || part == "." || part == ".." || strings.HasPrefix(part, ".tmp-") {
			return "", fmt.Errorf("state: bad object name %q", name)
		}
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

func (s *fileStore) get(ctx context.Context, name string, off, n int64) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := s.path(name)
	if err != nil {
		return nil, err
	}
	// Immutable objects (segments) go through the open-file cache; others are opened per read.
	if strings.HasSuffix(name, segSuffix) {
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

func (s *fileStore) readAt(f *os.File, size int64, name string, off, n int64) ([]byte, error) {
	if off < 0 || off > size {
		return nil, &Error{Op: "get", Object: name, Err: errors.New("range out of bounds")}
	}
	if n < 0 || off+n > size {
		n = size - off
	}
	if s.reader != nil {
		b, err := s.reader.readAt(f, off, n)
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

func etagOf(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:16])
}

func (s *fileStore) put(ctx context.Context, name string, data []byte, c putCond) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	p, err := s.path(name)
	if err != nil {
		return "", err
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fileErr("put", name, err)
	}
	tmp, err := s.writeTemp(dir, data)
	if err != nil {
		return "", fileErr("put", name, err)
	}
	defer os.Remove(tmp) // no-op once renamed or linked
	switch {
	case c.ifAbsent:
		// link(2) fails with EEXIST if the name exists: an atomic create-only.
		if err := os.Link(tmp, p); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return "", errPrecondition
			}
			return "", fileErr("put", name, err)
		}
	case c.ifMatch != "":
		unlock, err := s.lock()
		if err != nil {
			return "", fileErr("put", name, err)
		}
		defer unlock()
		cur, err := os.ReadFile(p)
		if err != nil || etagOf(cur) != c.ifMatch {
			return "", errPrecondition
		}
		if err := os.Rename(tmp, p); err != nil {
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
	return etagOf(data), nil
}

func (s *fileStore) writeTemp(dir string, data []byte) (string, error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, ".tmp-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return "", err
	}
	_, err = f.Write(data)
	if err == nil && s.fsync {
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

func (s *fileStore) syncDir(dir string) error {
	if !s.fsync {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (s *fileStore) lock() (func(), error) {
	s.casMu.Lock()
	f, err := os.OpenFile(filepath.Join(s.root, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		s.casMu.Unlock()
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		s.casMu.Unlock()
		return nil, err
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
		s.casMu.Unlock()
	}, nil
}

func (s *fileStore) head(ctx context.Context, name string) (objectInfo, error) {
	p, err := s.path(name)
	if err != nil {
		return objectInfo{}, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return objectInfo{}, fileErr("head", name, err)
	}
	st, err := os.Stat(p)
	if err != nil {
		return objectInfo{}, fileErr("head", name, err)
	}
	return objectInfo{name: name, size: int64(len(b)), modTime: st.ModTime(), etag: etagOf(b)}, nil
}

func (s *fileStore) list(ctx context.Context, prefix string) ([]objectInfo, error) {
	// Walk the deepest directory named by the prefix.
	dirPart := prefix
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		dirPart = prefix[:i]
	} else {
		dirPart = ""
	}
	start := filepath.Join(s.root, filepath.FromSlash(dirPart))
	var out []objectInfo
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			return nil
		}
		rel, err := filepath.Rel(s.root, p)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		if !strings.HasPrefix(name, prefix) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		out = append(out, objectInfo{name: name, size: info.Size(), modTime: info.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fileErr("list", prefix, err)
	}
	return out, nil
}

func (s *fileStore) del(ctx context.Context, name string) error {
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

func (s *fileStore) close() error {
	err := s.files.closeAll()
	if s.reader != nil {
		if rerr := s.reader.close(); err == nil {
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
