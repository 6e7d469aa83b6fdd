// Package objstore is the one object-store layer of the module: a flat namespace of objects
// with ranged reads and conditional writes, over three pools:
//
//   - Mem: in process memory (tests, mem:// state pools);
//   - File: one file per object under a directory, every write atomic and durable
//     (write-temp, fsync, rename or link, fsync of the directory);
//   - S3: S3 or an S3-compatible server through aws-sdk-go-v2, with bounded connections,
//     per-attempt timeouts and retries.
//
// Conditional writes are the two S3 offers and every pool evaluates atomically: create only if
// absent (If-None-Match: *) and replace only the object with a given ETag (If-Match). A failed
// condition is ErrPrecondition. Failures are *Error values that say whether a retry may help.
//
// host/state keeps its checkpoints here, host/control its catalog and modules. Both translate
// these errors into their own vocabulary at their seam; ErrNotFound is shared.
package objstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Store is an object pool. Names use '/' separators and are relative to the pool root (the
// directory or the S3 prefix); ValidName says which names a pool accepts.
type Store interface {
	// Get reads n bytes at off (n < 0: to the end). A missing object is ErrNotFound.
	Get(ctx context.Context, name string, off, n int64) ([]byte, error)
	// Read reads a whole object and returns it with its ETag, both from one read: a
	// conditional Put with that ETag replaces exactly the bytes returned.
	Read(ctx context.Context, name string) ([]byte, string, error)
	// Put writes a whole object atomically: readers see the old object or the new one, never
	// a torn one. It returns the new object's ETag. A failed condition is ErrPrecondition.
	Put(ctx context.Context, name string, data []byte, c Cond) (etag string, err error)
	// Head returns the object's size, modification time and ETag (ErrNotFound when missing).
	Head(ctx context.Context, name string) (Info, error)
	// List returns every object whose name starts with prefix, in no particular order. The
	// ETag of a listed object may be empty (the file pool does not hash on a list).
	List(ctx context.Context, prefix string) ([]Info, error)
	// Delete removes an object; removing a missing object is not an error.
	Delete(ctx context.Context, name string) error
	Close() error
}

// Cond makes a Put conditional: IfAbsent creates only a new object (S3 If-None-Match: *);
// IfMatch replaces only the object with that ETag (S3 If-Match). The zero Cond writes always.
type Cond struct {
	IfAbsent bool
	IfMatch  string
}

// Info describes one object.
type Info struct {
	Name    string
	Size    int64
	ModTime time.Time
	ETag    string
}

var (
	// ErrNotFound reports a missing object. host/state and host/control export it as their own
	// ErrNotFound.
	ErrNotFound = errors.New("not found")
	// ErrPrecondition is a conditional Put whose condition failed: another writer created or
	// replaced the object first. Pools return it unwrapped.
	ErrPrecondition = errors.New("precondition failed")
)

// Error is a failed pool operation. Retryable tells whether the same operation may succeed if
// tried again later (a timeout, a 5xx, throttling, a local I/O error); a permanent error (access
// denied, a missing object, a bad request) will not.
type Error struct {
	Op        string // "get", "put", "head", "list", "delete", "open", "usage"
	Object    string // object name or prefix, when known
	Retryable bool
	Err       error
}

func (e *Error) Error() string { return Describe("objstore", e.Op, e.Object, e.Retryable, e.Err) }

// Describe is the message of a failed operation on the durable tier, in the form every layer
// over the pools uses: "layer: op object (retryable|permanent): cause".
func Describe(layer, op, object string, retryable bool, err error) string {
	kind := "permanent"
	if retryable {
		kind = "retryable"
	}
	if object != "" {
		return fmt.Sprintf("%s: %s %s (%s): %v", layer, op, object, kind, err)
	}
	return fmt.Sprintf("%s: %s (%s): %v", layer, op, kind, err)
}

func (e *Error) Unwrap() error { return e.Err }

// IsRetryable reports whether err is a pool failure that may succeed when retried.
func IsRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Retryable
}

// ValidName reports whether every pool accepts name: '/'-separated parts, none empty, "." or
// "..", none starting with '.' (the file pool's temporaries and lock file), no backslash or NUL,
// not absolute. The same rule on every pool keeps a namespace portable between them.
func ValidName(name string) error {
	if name == "" || strings.HasPrefix(name, "/") || strings.ContainsAny(name, "\\\x00") {
		return fmt.Errorf("objstore: bad object name %q", name)
	}
	for part := range strings.SplitSeq(name, "/") {
		if part == "" || strings.HasPrefix(part, ".") {
			return fmt.Errorf("objstore: bad object name %q", name)
		}
	}
	return nil
}

// ETagOf is the ETag the file pool gives an object: a hash of its bytes, so a
// rewrite with the same bytes keeps the ETag.
func ETagOf(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:16])
}
