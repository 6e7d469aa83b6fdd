package uring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is one io_uring instance: the file descriptor and the three shared mappings (SQ ring, CQ
// ring, SQE array). It knows the memory protocol and nothing about operations.
//
// Memory protocol (see io_uring(7), "Submission queue polling" and the liburing barriers):
//   - We own the SQ tail and the CQ head; the kernel owns the SQ head and the CQ tail.
//   - An SQE is written with plain stores, then the SQ tail is published with an atomic store
//     (release): the kernel must not see the new tail before the SQE contents.
//   - The CQ tail is read with an atomic load (acquire) before the CQEs it covers are read, and
//     the CQ head is published with an atomic store (release) only after they have been copied
//     out: the kernel may overwrite a slot as soon as the head passes it.
//
// Go's sync/atomic operations are sequentially consistent, which is stronger than what is needed.
//
// Who may touch what:
//   - sqTailLocal, nextSQE, publish: the caller's lock (reactor.mu) must be held.
//   - cqHeadLocal, reap: the dispatch goroutine only.
//   - enter: any goroutine; the kernel serialises submitters on its own lock.
type ring struct {
	fd       int
	features uint32

	sqMem, cqMem, sqeMem unsafe.Pointer // cqMem == sqMem with IORING_FEAT_SINGLE_MMAP
	sqLen, cqLen, sqeLen uintptr

	sqHead, sqTail, sqFlags *uint32 // shared with the kernel
	sqMask, sqEntries       uint32
	sqes                    []ioSQE
	sqTailLocal             uint32 // next free SQE; published to *sqTail by publish

	cqHead, cqTail    *uint32 // shared with the kernel
	cqMask, cqEntries uint32
	cqes              []ioCQE
	cqHeadLocal       uint32 // dispatch goroutine only
}

// newRing sets up a ring with at least sqEntries submission slots and cqEntries completion
// slots (the kernel rounds both up to powers of two).
func newRing(sqEntries, cqEntries uint32) (*ring, error) {
	p := ioParams{flags: setupCQSize | setupClamp | setupSubmitAll, cqEntries: cqEntries}
	fd, err := ioSetup(sqEntries, &p)
	if errors.Is(err, unix.EINVAL) {
		// SUBMIT_ALL is 5.18; older kernels reject unknown flags. It is only an optimisation
		// (the submit loop copes with a short submission), so retry without it.
		p = ioParams{flags: setupCQSize | setupClamp, cqEntries: cqEntries}
		fd, err = ioSetup(sqEntries, &p)
	}
	if err != nil {
		return nil, err
	}
	r := &ring{fd: fd, features: p.features}
	if err := r.mmap(&p); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *ring) mmap(p *ioParams) error {
	const prot = unix.PROT_READ | unix.PROT_WRITE
	const flags = unix.MAP_SHARED | unix.MAP_POPULATE

	r.sqLen = uintptr(p.sqOff.array) + uintptr(p.sqEntries)*4
	r.cqLen = uintptr(p.cqOff.cqes) + uintptr(p.cqEntries)*sizeofCQE
	single := p.features&featSingleMmap != 0
	if single {
		// One mapping at OFF_SQ_RING holds both rings; it must be big enough for either.
		r.sqLen = max(r.sqLen, r.cqLen)
		r.cqLen = r.sqLen
	}
	var err error
	if r.sqMem, err = unix.MmapPtr(r.fd, offSQRing, nil, r.sqLen, prot, flags); err != nil {
		r.sqMem = nil
		return fmt.Errorf("uring: mmap SQ ring: %w", err)
	}
	if single {
		r.cqMem = r.sqMem
	} else if r.cqMem, err = unix.MmapPtr(r.fd, offCQRing, nil, r.cqLen, prot, flags); err != nil {
		r.cqMem = nil
		return fmt.Errorf("uring: mmap CQ ring: %w", err)
	}
	r.sqeLen = uintptr(p.sqEntries) * sizeofSQE
	if r.sqeMem, err = unix.MmapPtr(r.fd, offSQEs, nil, r.sqeLen, prot, flags); err != nil {
		r.sqeMem = nil
		return fmt.Errorf("uring: mmap SQEs: %w", err)
	}

	u32 := func(base unsafe.Pointer, off uint32) *uint32 { return (*uint32)(unsafe.Add(base, off)) }
	r.sqHead = u32(r.sqMem, p.sqOff.head)
	r.sqTail = u32(r.sqMem, p.sqOff.tail)
	r.sqFlags = u32(r.sqMem, p.sqOff.flags)
	r.sqMask = *u32(r.sqMem, p.sqOff.ringMask)
	r.sqEntries = *u32(r.sqMem, p.sqOff.ringEntries)
	r.sqes = unsafe.Slice((*ioSQE)(r.sqeMem), r.sqEntries)
	// The SQ ring holds indices into the SQE array rather than SQEs. We always fill SQE i
	// for ring slot i, so the index array is the identity and is written once, here.
	array := unsafe.Slice(u32(r.sqMem, p.sqOff.array), r.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	r.sqTailLocal = atomic.LoadUint32(r.sqTail)

	r.cqHead = u32(r.cqMem, p.cqOff.head)
	r.cqTail = u32(r.cqMem, p.cqOff.tail)
	r.cqMask = *u32(r.cqMem, p.cqOff.ringMask)
	r.cqEntries = *u32(r.cqMem, p.cqOff.ringEntries)
	r.cqes = unsafe.Slice((*ioCQE)(unsafe.Add(r.cqMem, p.cqOff.cqes)), r.cqEntries)
	r.cqHeadLocal = atomic.LoadUint32(r.cqHead)
	return nil
}

// nextSQE returns the next free, zeroed SQE, or nil when every slot holds an SQE the kernel
// has not consumed yet. The SQE becomes visible to the kernel at the next publish.
func (r *ring) nextSQE() *ioSQE {
	if r.sqTailLocal-atomic.LoadUint32(r.sqHead) >= r.sqEntries {
		return nil
	}
	s := &r.sqes[r.sqTailLocal&r.sqMask]
	r.sqTailLocal++
	*s = ioSQE{}
	return s
}

// publish makes every SQE handed out by nextSQE visible to the kernel and returns how many
// are waiting to be consumed by io_uring_enter.
func (r *ring) publish() uint32 {
	atomic.StoreUint32(r.sqTail, r.sqTailLocal)
	return r.sqTailLocal - atomic.LoadUint32(r.sqHead)
}

// submit asks the kernel to consume up to n published SQEs. It returns how many it took.
// Requests that fail validation still consume their SQE and post an error CQE.
func (r *ring) submit(n uint32) (int, error) {
	return ioEnter(r.fd, n, 0, 0)
}

// wait blocks until at least one CQE is available (or a signal interrupts the wait, reported
// as EINTR).
func (r *ring) wait() error {
	_, err := ioEnter(r.fd, 0, 1, enterGetEvents)
	return err
}

// overflowed reports whether the kernel is holding completions in its overflow list because
// the CQ ring was full; an io_uring_enter with GETEVENTS moves them into the ring.
func (r *ring) overflowed() bool {
	return atomic.LoadUint32(r.sqFlags)&sqCQOverflow != 0
}

// reap appends every available CQE to dst and releases their ring slots to the kernel.
// Dispatch goroutine only.
func (r *ring) reap(dst []ioCQE) []ioCQE {
	head := r.cqHeadLocal
	tail := atomic.LoadUint32(r.cqTail)
	for ; head != tail; head++ {
		dst = append(dst, r.cqes[head&r.cqMask])
	}
	if head != r.cqHeadLocal {
		r.cqHeadLocal = head
		atomic.StoreUint32(r.cqHead, head)
	}
	return dst
}

// close unmaps the rings and closes the descriptor. The kernel keeps its own references to the
// ring pages, so unmapping while it still finishes cancelled requests is safe; Go memory those
// requests point at is the reactor's problem (see reactor.close).
func (r *ring) close() error {
	var errs []error
	for _, m := range []struct {
		p *unsafe.Pointer
		n uintptr
	}{{&r.sqeMem, r.sqeLen}, {&r.cqMem, r.cqLen}, {&r.sqMem, r.sqLen}} {
		if *m.p == nil || (m.p == &r.cqMem && r.cqMem == r.sqMem) {
			continue
		}
		if err := unix.MunmapPtr(*m.p, m.n); err != nil {
			errs = append(errs, err)
		}
		*m.p = nil
	}
	r.cqMem = nil
	r.sqes, r.cqes = nil, nil
	if r.fd >= 0 {
		if err := unix.Close(r.fd); err != nil {
			errs = append(errs, err)
		}
		r.fd = -1
	}
	return errors.Join(errs...)
}

// probeOps reports which opcodes the kernel supports, via IORING_REGISTER_PROBE (5.6).
func (r *ring) probeOps() ([probeOpsLength]bool, error) {
	// struct io_uring_probe: 16-byte header (last_op, ops_len, resv, resv2[3]) then
	// struct io_uring_probe_op[ops_len] of 8 bytes each (op, resv, flags u16, resv2 u32).
	var buf [16 + probeOpsLength*8]byte
	var ops [probeOpsLength]bool
	if err := ioRegister(r.fd, registerProbe, unsafe.Pointer(&buf[0]), probeOpsLength); err != nil {
		return ops, err
	}
	n := int(buf[1])
	for i := 0; i < n && i < probeOpsLength; i++ {
		e := buf[16+8*i:]
		ops[e[0]] = binary.NativeEndian.Uint16(e[2:])&opSupported != 0
	}
	return ops, nil
}
