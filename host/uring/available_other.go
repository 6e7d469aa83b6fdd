//go:build unix && !linux

package uring

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Available reports whether io_uring works in this process. It never does off Linux.
func Available() error { return errNotLinux }

var errNotLinux = fmt.Errorf("%w: not Linux: %w", ErrUnavailable, unix.ENOSYS)

func newRingEngine(config) (engine, error) { return nil, errNotLinux }
