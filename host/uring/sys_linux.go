package uring

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Kernel UAPI for io_uring, transcribed from include/uapi/linux/io_uring.h. golang.org/x/sys/unix
// (v0.50.0) carries only the syscall numbers, so the constants and struct layouts live here.
// TestUAPILayout pins the struct sizes and field offsets against the header.

// io_uring_setup(2) flags.
const (
	setupCQSize    = 1 << 3 // IORING_SETUP_CQSIZE: cq_entries in params is honoured
	setupClamp     = 1 << 4 // IORING_SETUP_CLAMP: clamp oversized rings instead of failing
	setupSubmitAll = 1 << 7 // IORING_SETUP_SUBMIT_ALL: keep submitting past a failed SQE (5.18)
)

// io_uring_params.features bits we look at.
const (
	featSingleMmap = 1 << 0 // IORING_FEAT_SINGLE_MMAP: SQ and CQ rings share one mapping (5.4)
	featNoDrop     = 1 << 1 // IORING_FEAT_NODROP: the kernel buffers CQEs rather than dropping (5.5)
)

// io_uring_enter(2) flags.
const (
	enterGetEvents = 1 << 0 // IORING_ENTER_GETEVENTS
)

// sq_ring->flags.
const (
	sqCQOverflow = 1 << 1 // IORING_SQ_CQ_OVERFLOW: completions wait in the kernel's overflow list
)

// mmap offsets.
const (
	offSQRing = 0          // IORING_OFF_SQ_RING
	offCQRing = 0x8000000  // IORING_OFF_CQ_RING
	offSQEs   = 0x10000000 // IORING_OFF_SQES
)

// Opcodes (enum io_uring_op). Only the ones this package issues.
const (
	opcodeNop         = 0  // IORING_OP_NOP
	opcodeTimeout     = 11 // IORING_OP_TIMEOUT
	opcodeAccept      = 13 // IORING_OP_ACCEPT
	opcodeAsyncCancel = 14 // IORING_OP_ASYNC_CANCEL
	opcodeConnect     = 16 // IORING_OP_CONNECT
	opcodeRead        = 22 // IORING_OP_READ (5.6)
	opcodeWrite       = 23 // IORING_OP_WRITE (5.6)
)

// io_uring_register(2) opcodes.
const (
	registerProbe  = 8      // IORING_REGISTER_PROBE (5.6)
	opSupported    = 1 << 0 // IO_URING_OP_SUPPORTED in io_uring_probe_op.flags
	probeOpsLength = 256
)

// sizeofSQE and sizeofCQE are the entry sizes without IORING_SETUP_SQE128/CQE32, which we never set.
const (
	sizeofSQE = 64
	sizeofCQE = 16
)

// ioSQE is struct io_uring_sqe. The unions are flattened to the member this package uses:
// off doubles as addr2 (accept's addrlen pointer, connect's addrlen), opFlags as
// rw_flags/timeout_flags/accept_flags/cancel_flags.
type ioSQE struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	opFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	_           uint64
}

// ioCQE is struct io_uring_cqe (without the CQE32 extension).
type ioCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

type sqringOffsets struct {
	head        uint32
	tail        uint32
	ringMask    uint32
	ringEntries uint32
	flags       uint32
	dropped     uint32
	array       uint32
	resv1       uint32
	userAddr    uint64
}

type cqringOffsets struct {
	head        uint32
	tail        uint32
	ringMask    uint32
	ringEntries uint32
	overflow    uint32
	cqes        uint32
	flags       uint32
	resv1       uint32
	userAddr    uint64
}

// ioParams is struct io_uring_params, passed to io_uring_setup and filled in by the kernel.
type ioParams struct {
	sqEntries    uint32
	cqEntries    uint32
	flags        uint32
	sqThreadCPU  uint32
	sqThreadIdle uint32
	features     uint32
	wqFD         uint32
	resv         [3]uint32
	sqOff        sqringOffsets
	cqOff        cqringOffsets
}

// ioSetup is io_uring_setup(2). unix.Syscall (not RawSyscall) so the runtime can hand the P to
// another thread should the kernel take its time allocating the rings.
func ioSetup(entries uint32, p *ioParams) (int, error) {
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(p)), 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

// ioEnter is io_uring_enter(2) without a signal mask. With enterGetEvents and minComplete > 0
// it blocks; unix.Syscall6 tells the scheduler so, which is what lets one goroutine park in
// the kernel waiting for completions without starving the others.
func ioEnter(fd int, toSubmit, minComplete, flags uint32) (int, error) {
	n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(fd), uintptr(toSubmit),
		uintptr(minComplete), uintptr(flags), 0, 0)
	if errno != 0 {
		return int(n), errno
	}
	return int(n), nil
}

// ioRegister is io_uring_register(2).
func ioRegister(fd int, opcode uint32, arg unsafe.Pointer, nrArgs uint32) error {
	_, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(fd), uintptr(opcode),
		uintptr(arg), uintptr(nrArgs), 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
