// Package state holds the keyed state of clink-wasm operators: a bounded in-memory hot tier in
// front of a durable remote tier (a local directory by default, S3 in production), incremental
// checkpoints and lazy restore.
//
// A process opens one [Store] over a pool URL (mem://, file:///path or s3://bucket/prefix) and
// gets one [Backend] per operator subtask from [Store.Operator]: a [*Tiered]. [Memory] is the
// volatile reference backend. The durable format, the checkpoint protocol and the options are
// documented in docs/state-format.md. Two internal packages sit under the seam this package
// reads and writes through: the byte layout of segments and manifests (host/state/internal/format)
// and the mem, file and S3 pools (internal/objstore, shared with host/control).
//
// # Threading
//
// A [Backend] belongs to one operator subtask. Its runner-side methods (Get, Put, Delete, Fill,
// Capture, operator state) are called only by that subtask's runner role, one call at a time, and
// take no locks on the fast path. Fetch and Persist do their IO off the runner and report back
// through a callback or a return value; they must never touch runner-side structures without
// synchronisation.
//
// # Keys
//
// A [Key] names one entry: a state (by its [StateID] for this operator), the record key that
// scopes it, and the entry key within that record key's map. Keys passed to a Backend point into
// caller buffers (often guest memory): a Backend copies whatever it keeps.
package state

import "context"

// StateID identifies a named state within one operator: the index of the name in the slice given
// to [Backend.Open].
type StateID uint16

// Key names one entry of keyed state.
type Key struct {
	State  StateID
	Record []byte // the record key that scopes the entry
	Entry  []byte // the entry within the record key's map; empty for a per-key value
}

// Fetched is the result of loading one key from the durable tier.
type Fetched struct {
	Key   Key    // owned copy
	Value []byte // owned; nil when !Found
	Found bool

	// gen is set by a Tiered Fetch: it lets Fill detect a result that a later write may have
	// made stale. Results built by hand (gen 0) are installed only while no written key has
	// been evicted yet; pass Fill the results Fetch produced.
	gen uint64
}

// Backend is the keyed state of one operator subtask.
type Backend interface {
	// Open binds state names to StateIDs (their index in names). Called once before use.
	Open(names []string) error

	// Get probes the hot tier. hot reports whether the answer is authoritative; when hot is
	// false the key must be loaded with Fetch and installed with Fill before it can be read.
	// The returned value aliases backend memory and is valid until the next call on the
	// Backend: copy it out at once.
	Get(k Key) (value []byte, found, hot bool)

	// Put and Delete write through the hot tier; the key becomes dirty until a checkpoint
	// commits it.
	Put(k Key, value []byte)
	Delete(k Key)

	// Fetch loads keys that Get reported cold, as one batched request where the tier allows.
	// It returns at once; done is called exactly once, on any goroutine, with one result per
	// key in order, or an error if the durable tier failed after its retries. The slice keys
	// is the caller's again once done is called (the scheduler reuses it for a later Fetch).
	Fetch(keys []Key, done func([]Fetched, error))

	// Fill installs fetched values into the hot tier (runner side), unless the key was written
	// since, in which case the newer local value wins.
	Fill(results []Fetched)

	// SetOperatorState stores a non-keyed blob (for example the timer queue) to be included in
	// the next checkpoint; OperatorState returns the restored or last set blob.
	SetOperatorState(name string, data []byte)
	OperatorState(name string) []byte

	// Capture takes a point-in-time delta of everything written since the last capture, on
	// the runner. The returned Snapshot persists it off the runner.
	Capture(checkpointID uint64) (Snapshot, error)

	// Close releases the backend's resources.
	Close() error
}

// Holder is implemented by backends whose hot tier evicts (Tiered): Hold keeps a hot key from
// being evicted until Release (runner side, counted: every successful Hold needs one Release).
// The scheduler holds a record's prefetched values from their load until its call has run.
type Holder interface {
	Hold(k Key) bool // reports whether k was hot (and is now held)
	Release(k Key)
	// FillHold is Fill for a caller that guarantees it wrote none of these keys since Get
	// reported them cold (the scheduler's per-key gate guarantees it): every result is
	// installed, unless the key is hot again, without Fill's guard against stale fetches,
	// which exists for writes the backend cannot rule out. Results with hold[i] are then
	// held, as by a successful Hold.
	FillHold(results []Fetched, hold []bool)
}

var _ Holder = (*Tiered)(nil)

// Snapshot is a captured checkpoint delta waiting to be made durable.
type Snapshot interface {
	// Persist commits the delta durably, then returns. A checkpoint is complete (and may be
	// acknowledged) only after Persist returns nil. Called off the runner.
	Persist(ctx context.Context) error
	// Bytes is the encoded size of the delta.
	Bytes() int64
}
