//go:build !linux

package ingest

import "os"

// fdatasync is fsync where the system has no fdatasync that this package uses.
func fdatasync(f *os.File) error { return f.Sync() }
