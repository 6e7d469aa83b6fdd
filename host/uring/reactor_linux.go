package uring

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ringEngine is the io_uring Reactor: submitters fill SQEs under mu, one dispatch goroutine
// reaps CQEs and runs the callbacks.
//
// Submission is group commit: the goroutine that finds nobody flushing becomes the flusher and
// calls io_uring_enter for every SQE published so far, looping until none is left; goroutines
// that arrive meanwhile only fill SQEs and return. Under load one system call carries many
// SQEs; an idle reactor pays one io_uring_enter per operation, in the submitter's goroutine.
type ringEngine struct {
	r            *ring
	capacity     int // bounded operations (not Op.openEnded) the kernel may hold at once
	closeTimeout time.Duration

	mu struct {
		sync.Mutex
		closed    bool
		abandoned bool // Close gave up waiting; CQEs for emptied slots are expected and ignored

		// INVARIANT: held == number of non-nil slots; bounded == how many of those are not
		// open-ended (Op.openEnded), and bounded <= capacity. Only bounded operations wait in
		// queue. Open-ended ones (socket reads and writes, accept, connect, timers) go to the
		// kernel at once however many there are, because one of them may be waiting for
		// something only an operation behind it in the queue would bring about. Their number
		// is the caller's (one read and one write per connection, say), so held has no fixed
		// limit, the slot table grows past capacity for them, and the CQ ring, sized at
		// 4*capacity, can overflow: the kernel then parks CQEs (IORING_FEAT_NODROP, required)
		// and dispatch moves them in.
		held, bounded int
		slots         []*opState // slot index (low 32 bits of user_data) -> operation in the kernel
		gens          []uint32   // generation per slot, so a late cancel cannot hit the slot's next tenant
		free          []uint32
		queue         fifo // bounded operations waiting for capacity, FIFO

		// INVARIANT: while flushing is true, one goroutine is in flush and will submit every
		// SQE published before it clears the flag, so nobody else needs to call
		// io_uring_enter to submit.
		flushing bool
	}
	flushIdle  *sync.Cond    // broadcast (on mu) when flushing goes false
	dispatched chan struct{} // closed when the dispatch goroutine has returned

	// Counters for tests and benchmarks; updated once per system call or batch, not per
	// operation. submitted/enters is the batching the group commit achieves.
	maxInflight       atomic.Int64 // high-water mark of mu.bounded
	maxHeld           atomic.Int64 // high-water mark of mu.held
	enters, submitted atomic.Int64 // io_uring_enter calls that submitted, and SQEs offered to them
	reaps, reaped     atomic.Int64 // non-empty CQ reaps, and CQEs they returned
	overflowFlushes   atomic.Int64 // times dispatch found CQEs parked in the kernel's overflow list
}

// User data of the SQEs the engine issues for itself (cancellations, wake-up NOPs). Their
// completions are dropped. User operations carry generation<<32 | slot with bit 63 clear.
const internalUserData = 1 << 63

func userData(o *opState) uint64 { return uint64(o.gen)<<32 | uint64(o.slot) }

func newRingEngine(c config) (engine, error) {
	r, err := newRing(uint32(c.entries), uint32(4*c.entries))
	if err != nil {
		return nil, fmt.Errorf("uring: io_uring_setup: %w", err)
	}
	e := &ringEngine{
		r:            r,
		capacity:     min(c.entries, int(r.sqEntries)),
		closeTimeout: c.closeTimeout,
		dispatched:   make(chan struct{}),
	}
	e.flushIdle = sync.NewCond(&e.mu)
	e.mu.slots = make([]*opState, e.capacity)
	e.mu.gens = make([]uint32, e.capacity)
	e.mu.free = make([]uint32, e.capacity)
	for i := range e.mu.free {
		e.mu.free[i] = uint32(e.capacity - 1 - i) // pop from the end hands out slot 0 first
	}
	go e.dispatch()
	return e, nil
}

func (e *ringEngine) submit(o *opState) error {
	// Argument structures the kernel reads are allocated outside the lock.
	switch o.code {
	case opConnect:
		rsa, n, err := rawSockaddr(o.sa)
		if err != nil {
			return err
		}
		o.rsa, o.rsaLen = rsa, n
	case opTimeout:
		o.ts = &kernelTimespec{sec: int64(o.dur / time.Second), nsec: int64(o.dur % time.Second)}
	}

	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	if !o.openEnded() && (e.mu.bounded >= e.capacity || e.mu.queue.len() > 0) {
		// The ring never holds more than capacity bounded operations; the rest wait in order.
		// Blocking instead would deadlock a done callback that submits a follow-up while the
		// ring is full, since only the dispatch goroutine running that callback can free a
		// slot. Open-ended operations never wait here (see Op.openEnded).
		o.phase = phaseQueued
		e.mu.queue.push(o)
		e.mu.Unlock()
		return nil
	}
	e.startLocked(o)
	lead := e.leadLocked()
	e.mu.Unlock()
	if lead {
		e.flush()
	}
	return nil
}

// startLocked gives o a slot and writes its SQE. The SQE reaches the kernel at the next flush.
func (e *ringEngine) startLocked(o *opState) {
	if len(e.mu.free) == 0 { // only open-ended operations take the table past capacity
		e.mu.free = append(e.mu.free, uint32(len(e.mu.slots)))
		e.mu.slots = append(e.mu.slots, nil)
		e.mu.gens = append(e.mu.gens, 0)
	}
	n := len(e.mu.free) - 1
	o.slot = e.mu.free[n]
	e.mu.free = e.mu.free[:n]
	o.gen = e.mu.gens[o.slot]
	o.phase = phaseRunning
	e.mu.slots[o.slot] = o
	e.mu.held++
	if h := int64(e.mu.held); h > e.maxHeld.Load() {
		e.maxHeld.Store(h)
	}
	if !o.openEnded() {
		e.mu.bounded++
		if b := int64(e.mu.bounded); b > e.maxInflight.Load() {
			e.maxInflight.Store(b)
		}
	}

	s := e.sqeLocked()
	s.userData = userData(o)
	s.fd = int32(o.fd)
	// INVARIANT: Go memory whose address is in an SQE stays reachable and pinned until its
	// CQE is reaped (complete unpins). Reachable: o sits in slots and references it. Pinned:
	// today's heap never moves objects, and storing the buffer in o already forces it off any
	// goroutine stack (whose contents can move), but runtime.Pinner is the documented contract
	// for Go memory held by non-Go code, so we rely on it rather than on the collector's
	// current design. It costs 100-200ns per operation (it registers a finalizer when the P's
	// pinner cache is empty); if the ring ever becomes the hot path, this is the first thing
	// to measure. Pinning a pointer to static data is a no-op.
	switch o.code {
	case opNop:
		s.opcode = opcodeNop
	case opRead, opWrite:
		s.opcode = opcodeRead
		if o.code == opWrite {
			s.opcode = opcodeWrite
		}
		if len(o.buf) > 0 {
			p := unsafe.Pointer(unsafe.SliceData(o.buf))
			o.pin.Pin(p)
			s.addr = uint64(uintptr(p))
		}
		s.len = uint32(len(o.buf))
		s.off = uint64(o.off)
		if o.off < 0 {
			s.off = ^uint64(0) // -1: use and advance the file position (IORING_FEAT_RW_CUR_POS)
		}
	case opConnect:
		o.pin.Pin(o.rsa)
		s.opcode = opcodeConnect
		s.addr = uint64(uintptr(unsafe.Pointer(o.rsa)))
		s.off = uint64(o.rsaLen) // connect takes the address length by value in sqe->off
	case opAccept:
		s.opcode = opcodeAccept
		s.opFlags = uint32(o.flags) // addr and addr2 left 0: we do not ask for the peer address
	case opTimeout:
		o.pin.Pin(o.ts)
		s.opcode = opcodeTimeout
		s.fd = -1
		s.addr = uint64(uintptr(unsafe.Pointer(o.ts)))
		s.len = 1 // one timespec
		s.off = 0 // completion count 0: a pure timer
	}
}

// sqeLocked returns a free SQE. When every SQ slot holds an SQE the kernel has not consumed
// (open-ended operations or cancellations beyond the SQ's size, submitted faster than the
// flusher drains them), it submits them synchronously, still under the lock, which the
// dispatch goroutine does not need in order to reap.
func (e *ringEngine) sqeLocked() *ioSQE {
	for {
		if s := e.r.nextSQE(); s != nil {
			return s
		}
		if _, err := e.r.submit(e.r.publish()); err != nil {
			e.retryOrDie(err)
		}
	}
}

// internalLocked queues an SQE the engine issues for itself.
func (e *ringEngine) internalLocked(opcode uint8, addr uint64) {
	s := e.sqeLocked()
	s.opcode = opcode
	s.fd = -1
	s.addr = addr
	s.userData = internalUserData
}

// leadLocked reports whether the caller must flush, and if so records that it will.
func (e *ringEngine) leadLocked() bool {
	if e.mu.flushing || e.r.sqTailLocal == atomic.LoadUint32(e.r.sqHead) {
		return false
	}
	e.mu.flushing = true
	return true
}

// flush submits SQEs until none is left unconsumed, then clears mu.flushing. The caller set
// mu.flushing through leadLocked.
func (e *ringEngine) flush() {
	e.mu.Lock()
	for {
		n := e.r.publish()
		if n == 0 {
			e.mu.flushing = false
			e.flushIdle.Broadcast()
			e.mu.Unlock()
			return
		}
		e.mu.Unlock()
		e.enters.Add(1)
		e.submitted.Add(int64(n))
		if _, err := e.r.submit(n); err != nil {
			e.retryOrDie(err)
		}
		e.mu.Lock()
	}
}

// retryOrDie handles an io_uring_enter error on the submit side. EINTR (a signal, such as the
// runtime's preemption signal), EAGAIN (transient kernel allocation failure) and EBUSY
// (completions waiting in the overflow list) are retried; the dispatch goroutine drains the
// CQ meanwhile. Anything else means the ring or an SQE is corrupt, which this package's own
// code must make impossible, so it is a bug worth a crash rather than a silent hang.
func (e *ringEngine) retryOrDie(err error) {
	switch err {
	case unix.EINTR:
	case unix.EAGAIN, unix.EBUSY:
		time.Sleep(20 * time.Microsecond)
	default:
		panic(fmt.Sprintf("uring: io_uring_enter submit: %v", err))
	}
}

// dispatch is the only reader of the CQ ring. It runs until Close, after the last in-flight
// operation has completed (or been abandoned).
func (e *ringEngine) dispatch() {
	defer close(e.dispatched)
	var cqes []ioCQE
	var ready []completion
	yielded := false
	for {
		cqes = e.r.reap(cqes[:0])
		if len(cqes) == 0 {
			if e.r.overflowed() {
				// More completions arrived than the CQ ring holds (open-ended operations
				// are not bounded by capacity). With IORING_FEAT_NODROP the kernel parks
				// them in its overflow list and sets IORING_SQ_CQ_OVERFLOW; nothing moves
				// them into the ring but an io_uring_enter with GETEVENTS.
				e.overflowFlushes.Add(1)
				if _, err := ioEnter(e.r.fd, 0, 0, enterGetEvents); err != nil {
					e.waitErr(err)
				}
				continue
			}
			if e.exiting() {
				return
			}
			if !yielded {
				// The callbacks just run have likely readied goroutines (a Do waiter, say)
				// onto this P. Blocking in io_uring_enter now would keep that P in a system
				// call, and them off a CPU, until sysmon retakes it some 20µs later. Let
				// them run first; they may submit work that completes before we look again.
				yielded = true
				runtime.Gosched()
				continue
			}
			yielded = false
			if err := e.r.wait(); err != nil {
				e.waitErr(err)
			}
			continue
		}
		yielded = false
		e.reaps.Add(1)
		e.reaped.Add(int64(len(cqes)))
		var lead bool
		ready, lead = e.complete(cqes, ready)
		for i := range ready {
			ready[i].o.done(ready[i].res)
			ready[i] = completion{}
		}
		ready = ready[:0]
		if lead {
			e.flush()
		}
	}
}

// waitErr handles an io_uring_enter(GETEVENTS) error in dispatch, which then loops. EINTR,
// EAGAIN and EBUSY are transient. EBADR means the kernel dropped a CQE despite
// IORING_FEAT_NODROP (it could not allocate an overflow entry): an operation will never
// complete and there is no telling which, so, as with anything else here, crashing beats a
// silent hang.
func (e *ringEngine) waitErr(err error) {
	switch err {
	case unix.EINTR, unix.EAGAIN, unix.EBUSY:
	case unix.EBADR:
		panic("uring: the kernel dropped a completion (io_uring_enter: EBADR)")
	default:
		panic(fmt.Sprintf("uring: io_uring_enter wait: %v", err))
	}
}

type completion struct {
	o   *opState
	res Result
}

func (e *ringEngine) exiting() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mu.closed && (e.mu.held == 0 || e.mu.abandoned)
}

// complete retires the operations behind cqes, refills the ring from the queue, and returns the
// callbacks to run (outside the lock).
//
// It also takes the flusher role, when free, for the duration of those callbacks: operations
// they submit (the next read of a chain, typically) then only fill SQEs, and the dispatcher
// submits them all with one io_uring_enter afterwards, when lead is true. Without this every
// callback's Submit would make its own system call.
func (e *ringEngine) complete(cqes []ioCQE, ready []completion) (_ []completion, lead bool) {
	e.mu.Lock()
	for _, c := range cqes {
		if c.userData&internalUserData != 0 {
			continue
		}
		idx := uint32(c.userData)
		var o *opState
		if idx < uint32(len(e.mu.slots)) {
			o = e.mu.slots[idx]
		}
		if o == nil || userData(o) != c.userData {
			if e.mu.abandoned {
				continue // its operation was completed with ErrClosed by abandon
			}
			panic(fmt.Sprintf("uring: completion for unknown operation %#x", c.userData))
		}
		e.mu.slots[idx] = nil
		e.mu.gens[idx] = (e.mu.gens[idx] + 1) &^ (1 << 31)
		e.mu.free = append(e.mu.free, idx)
		e.mu.held--
		if !o.openEnded() {
			e.mu.bounded--
		}
		o.phase = phaseDone
		o.pin.Unpin()
		ready = append(ready, completion{o, e.resultLocked(o, c.res)})
	}
	for !e.mu.closed && e.mu.bounded < e.capacity && e.mu.queue.len() > 0 {
		e.startLocked(e.mu.queue.pop())
	}
	if !e.mu.flushing {
		e.mu.flushing = true
		lead = true
	}
	e.mu.Unlock()
	return ready, lead
}

// resultLocked turns a CQE res into a Result.
func (e *ringEngine) resultLocked(o *opState, res int32) Result {
	switch {
	case o.code == opTimeout && (res >= 0 || res == -int32(unix.ETIME)):
		return Result{} // a pure timer reports its expiry as -ETIME
	case res >= 0:
		return Result{N: int(res)}
	case res == -int32(unix.ECANCELED) || res == -int32(unix.EINTR):
		// A cancelled io-wq worker reports EINTR; callers see one vocabulary for both.
		if o.canceled.Load() {
			return Result{Err: syscall.ECANCELED}
		}
		if e.mu.closed {
			return Result{Err: ErrClosed}
		}
	}
	return Result{Err: syscall.Errno(-res)}
}

func (e *ringEngine) cancel(o *opState) {
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock() // Close cancels everything itself
		return
	}
	switch o.phase {
	case phaseQueued:
		if !e.mu.queue.remove(o) {
			e.mu.Unlock() // never submitted: not the engine's to complete
			return
		}
		o.phase = phaseDone
		e.mu.Unlock()
		o.done(Result{Err: syscall.ECANCELED})
		return
	case phaseRunning:
		o.canceled.Store(true)
		// IORING_OP_ASYNC_CANCEL matches on user_data, which includes the slot generation:
		// if o completes before the cancel is processed, the cancel finds nothing (ENOENT)
		// rather than the slot's next tenant.
		e.internalLocked(opcodeAsyncCancel, userData(o))
	}
	lead := e.leadLocked()
	e.mu.Unlock()
	if lead {
		e.flush()
	}
}

func (e *ringEngine) close() error {
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	e.mu.closed = true
	queued := e.mu.queue.drain()
	for _, o := range queued {
		o.phase = phaseDone
	}
	// Cancel what the kernel holds. The SQ is consumed in order, so a cancellation always
	// reaches the kernel after the operation it targets, even one not yet submitted.
	for _, o := range e.mu.slots {
		if o != nil {
			e.internalLocked(opcodeAsyncCancel, userData(o))
		}
	}
	// Wake the dispatcher if it sleeps with nothing in flight; it sees closed and returns.
	e.internalLocked(opcodeNop, 0)
	lead := e.leadLocked()
	e.mu.Unlock()
	if lead {
		e.flush()
	}
	for _, o := range queued {
		o.done(Result{Err: ErrClosed})
	}

	t := time.NewTimer(e.closeTimeout)
	defer t.Stop()
	select {
	case <-e.dispatched:
	case <-t.C:
		e.abandon()
		<-e.dispatched
	}

	// No new flush can start (closed is set and the dispatcher is gone); wait out one still in
	// io_uring_enter before its descriptor is closed.
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.mu.flushing {
		e.flushIdle.Wait()
	}
	return e.r.close()
}

// abandon completes the operations the kernel still holds after the close timeout with
// ErrClosed, without waiting for the kernel to let go of them.
func (e *ringEngine) abandon() {
	e.mu.Lock()
	e.mu.abandoned = true
	var lost []*opState
	for i, o := range e.mu.slots {
		if o == nil {
			continue
		}
		e.mu.slots[i] = nil
		e.mu.held--
		if !o.openEnded() {
			e.mu.bounded--
		}
		o.phase = phaseDone
		lost = append(lost, o)
	}
	// The kernel may write into these operations' buffers until it tears the ring down,
	// asynchronously, after the descriptor is closed. Keeping them reachable (and pinned)
	// forever is a bounded leak; letting the collector reuse the memory would be corruption.
	orphans.Lock()
	orphans.ops = append(orphans.ops, lost...)
	orphans.Unlock()
	e.internalLocked(opcodeNop, 0) // wake the dispatcher so it sees abandoned and returns
	lead := e.leadLocked()
	e.mu.Unlock()
	if lead {
		e.flush()
	}
	for _, o := range lost {
		o.done(Result{Err: ErrClosed})
	}
}

// orphans holds operations abandoned by Close for the life of the process.
var orphans struct {
	sync.Mutex
	ops []*opState
}

// rawSockaddr converts sa into the kernel's representation, which the kernel reads during the
// connect (golang.org/x/sys/unix keeps its own conversion unexported).
func rawSockaddr(sa unix.Sockaddr) (*unix.RawSockaddrAny, uint32, error) {
	rsa := new(unix.RawSockaddrAny)
	putPort := func(p *uint16, port int) {
		b := (*[2]byte)(unsafe.Pointer(p)) // network byte order
		b[0], b[1] = byte(port>>8), byte(port)
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		if sa.Port < 0 || sa.Port > 0xFFFF {
			return nil, 0, unix.EINVAL
		}
		p := (*unix.RawSockaddrInet4)(unsafe.Pointer(rsa))
		p.Family = unix.AF_INET
		putPort(&p.Port, sa.Port)
		p.Addr = sa.Addr
		return rsa, unix.SizeofSockaddrInet4, nil
	case *unix.SockaddrInet6:
		if sa.Port < 0 || sa.Port > 0xFFFF {
			return nil, 0, unix.EINVAL
		}
		p := (*unix.RawSockaddrInet6)(unsafe.Pointer(rsa))
		p.Family = unix.AF_INET6
		putPort(&p.Port, sa.Port)
		p.Scope_id = sa.ZoneId
		p.Addr = sa.Addr
		return rsa, unix.SizeofSockaddrInet6, nil
	case *unix.SockaddrUnix:
		// Same rules as x/sys/unix: a leading '@' (or NUL) names an abstract socket, whose
		// length excludes the trailing NUL.
		p := (*unix.RawSockaddrUnix)(unsafe.Pointer(rsa))
		name := sa.Name
		n := len(name)
		if n > len(p.Path) || (n == len(p.Path) && name[0] != '@') {
			return nil, 0, unix.EINVAL
		}
		p.Family = unix.AF_UNIX
		for i := range n {
			p.Path[i] = int8(name[i])
		}
		sl := uint32(2)
		if n > 0 {
			sl += uint32(n) + 1
		}
		if p.Path[0] == '@' || (p.Path[0] == 0 && sl > 3) {
			p.Path[0] = 0
			sl--
		}
		return rsa, sl, nil
	}
	return nil, 0, unix.EAFNOSUPPORT
}
