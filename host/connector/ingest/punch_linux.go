package ingest

import (
	"os"

	"golang.org/x/sys/unix"
)

// punchHole frees the disk blocks of [off, off+n) of f, keeping its size and every offset.
func punchHole(f *os.File, off, n int64) error {
	return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}
