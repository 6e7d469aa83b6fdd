// Package format is the byte layout of host/state's durable tier: segments (sorted blocks of
// durable keys with a block index and a bloom filter), manifests (one checkpoint of one
// key-group lineage), the durable key order and the object names. docs/state-format.md is its
// specification; every decoder verifies checksums and bounds and reports ErrCorrupt rather
// than serving bad bytes. It does no I/O: host/state reads and writes the objects through its
// pool (internal/objstore).
package format

import (
	"errors"
	"fmt"
)

// ErrCorrupt reports bytes that fail their checksum or do not decode (state.ErrCorrupt).
var ErrCorrupt = errors.New("state: corrupt data")

// CorruptError locates corrupt bytes. It matches ErrCorrupt with errors.Is (state.CorruptError).
type CorruptError struct {
	Object string
	Offset int64
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("state: corrupt %s at offset %d: %s", e.Object, e.Offset, e.Reason)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// Corruptf returns a CorruptError for object at offset off.
func Corruptf(object string, off int64, format string, args ...any) error {
	return &CorruptError{Object: object, Offset: off, Reason: fmt.Sprintf(format, args...)}
}
