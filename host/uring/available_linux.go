package uring

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Available reports whether io_uring works in this process: nil if it does, otherwise an
// error matching ErrUnavailable that says why and wraps the syscall.Errno involved. The
// answer is computed once (a throwaway ring is set up and probed) and cached.
//
// Reasons it may not: a kernel before 5.6 (no IORING_OP_READ, no opcode probe) or built
// without CONFIG_IO_URING (ENOSYS); a seccomp filter, as container runtimes install by default
// since 2023 (EPERM or ENOSYS); the kernel.io_uring_disabled sysctl (EPERM); a sandbox such as
// gVisor (ENOSYS); RLIMIT_MEMLOCK on kernels before 5.12 (ENOMEM).
func Available() error { return availability() }

var availability = sync.OnceValue(probeIOUring)

// requiredOps are the opcodes the ring engine issues.
var requiredOps = []struct {
	code uint8
	name string
}{
	{opcodeNop, "NOP"}, {opcodeRead, "READ"}, {opcodeWrite, "WRITE"}, {opcodeConnect, "CONNECT"},
	{opcodeAccept, "ACCEPT"}, {opcodeTimeout, "TIMEOUT"}, {opcodeAsyncCancel, "ASYNC_CANCEL"},
}

func probeIOUring() error {
	disabled := ""
	if b, err := os.ReadFile("/proc/sys/kernel/io_uring_disabled"); err == nil {
		disabled = strings.TrimSpace(string(b))
	}
	if disabled == "2" {
		return fmt.Errorf("%w: disabled by sysctl kernel.io_uring_disabled=2", ErrUnavailable)
	}
	r, err := newRing(2, 4)
	if err != nil {
		return unavailable(err, disabled)
	}
	defer r.close()
	ops, err := r.probeOps()
	if err != nil {
		return fmt.Errorf("%w: IORING_REGISTER_PROBE failed (kernel older than 5.6?): %w", ErrUnavailable, err)
	}
	for _, op := range requiredOps {
		if !ops[op.code] {
			return fmt.Errorf("%w: kernel lacks IORING_OP_%s", ErrUnavailable, op.name)
		}
	}
	if r.features&featNoDrop == 0 {
		return fmt.Errorf("%w: kernel lacks IORING_FEAT_NODROP", ErrUnavailable)
	}
	return nil
}

// unavailable explains an io_uring_setup failure. disabled is the content of
// /proc/sys/kernel/io_uring_disabled, or "" where the sysctl does not exist (before 6.6).
func unavailable(err error, disabled string) error {
	var reason string
	switch {
	case errors.Is(err, unix.ENOSYS):
		reason = "io_uring_setup not implemented (kernel without CONFIG_IO_URING, a seccomp filter, or a sandbox such as gVisor)"
	case errors.Is(err, unix.EPERM) && disabled == "1":
		reason = "sysctl kernel.io_uring_disabled=1 and the process is neither privileged nor in kernel.io_uring_group"
	case errors.Is(err, unix.EPERM):
		reason = "io_uring_setup denied, most likely by a seccomp filter (container runtimes block io_uring by default)"
	case errors.Is(err, unix.ENOMEM):
		reason = "cannot allocate the rings (RLIMIT_MEMLOCK too low on kernels before 5.12)"
	default:
		reason = "io_uring_setup failed"
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, reason, err)
}
