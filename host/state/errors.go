package state

import (
	"errors"

	"github.com/clink-wasm/clink-wasm/host/state/internal/format"
	"github.com/clink-wasm/clink-wasm/internal/objstore"
)

// Sentinel errors. Match them with errors.Is; the typed errors below wrap them.
var (
	// ErrClosed is returned by a Store or Backend used after Close.
	ErrClosed = errors.New("state: closed")
	// ErrNotFound reports a missing object or checkpoint in the durable tier.
	ErrNotFound = objstore.ErrNotFound
	// ErrCorrupt reports bytes that fail their checksum or do not decode. Corrupt data is
	// reported, never served.
	ErrCorrupt = format.ErrCorrupt
	// ErrFenced reports that another writer committed first: a conditional write of a manifest
	// or a lineage head lost. The writer is stale and must stop; retrying cannot help.
	ErrFenced = errors.New("state: fenced by a newer writer")
	// ErrPreviousFailed is returned by Persist when an earlier snapshot of the same backend
	// failed: a checkpoint builds on its predecessor, so it cannot commit either. The keys of
	// both are captured again by the next Capture.
	ErrPreviousFailed = errors.New("state: previous checkpoint failed")
)

// Error is a failure of the durable tier. Retryable tells whether the same operation may succeed
// if tried again later (a timeout, a 5xx, throttling); a permanent error (corruption, fencing,
// access denied, a missing object) will not.
type Error struct {
	Op        string // "get", "put", "list", "delete", "commit", ...
	Object    string // object name, when known
	Retryable bool
	Err       error
}

func (e *Error) Error() string { return objstore.Describe("state", e.Op, e.Object, e.Retryable, e.Err) }

func (e *Error) Unwrap() error { return e.Err }

// IsRetryable reports whether err is a durable-tier failure that may succeed when retried.
func IsRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Retryable
}

// CorruptError locates corrupt bytes: Object, Offset and Reason. It matches ErrCorrupt with
// errors.Is.
type CorruptError = format.CorruptError
