package ingest

import (
	"os"

	"golang.org/x/sys/unix"
)

// fdatasync makes f's data durable, and of its metadata only what reading the data back needs
// (its size, its blocks): nothing, for a write inside blocks already written and fsynced.
func fdatasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
