//go:build !linux

package ingest

import "os"

// punchHole is a no-op where the platform cannot free a file's blocks in place: released
// records then keep their disk space.
func punchHole(f *os.File, off, n int64) error { return nil }
