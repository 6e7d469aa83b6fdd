//go:build unix

package uring

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

var (
	// ErrClosed is the result of an operation submitted after Close, or still queued or in
	// flight when Close ran and cancelled by it.
	ErrClosed = errors.New("uring: reactor closed")

	// ErrUnavailable is matched (errors.Is) by the error from Available, and from New with
	// WithBackend(BackendIOUring), when io_uring cannot be used here. The same error also
	// unwraps to the syscall.Errno that io_uring_setup returned, when there was one.
	ErrUnavailable = errors.New("uring: io_uring unavailable")
)

// Result is the outcome of one operation.
type Result struct {
	// N is the byte count for Read and Write, the new descriptor for Accept, and 0 otherwise.
	N int
	// Err is nil, a syscall.Errno as the kernel (or the pool's system call) reported it,
	// ErrClosed, or syscall.ECANCELED for an operation cancelled through Reactor.Do.
	Err error
}

// Op describes one operation. Build it with Nop, Read, Write, Connect, Accept or Timeout.
// Memory an Op refers to (Read and Write buffers) belongs to the kernel from Submit until the
// completion callback runs: the caller must not touch it in between.
type Op struct {
	code  opCode
	fd    int
	buf   []byte
	off   int64
	sa    unix.Sockaddr
	flags int
	dur   time.Duration
}

type opCode uint8

const (
	opNop opCode = iota
	opRead
	opWrite
	opConnect
	opAccept
	opTimeout
)

var opNames = [...]string{opNop: "nop", opRead: "read", opWrite: "write", opConnect: "connect",
	opAccept: "accept", opTimeout: "timeout"}

// String names the operation, for logs and errors.
func (o Op) String() string { return opNames[o.code] }

// Nop completes at once with a zero Result. It measures the reactor's own overhead.
func Nop() Op { return Op{code: opNop} }

// Read reads up to len(buf) bytes from fd at offset off, or at the descriptor's current
// position when off is negative, which sockets and pipes require. Like read(2), it may return
// fewer bytes than asked, and 0 at end of file.
func Read(fd int, buf []byte, off int64) Op { return Op{code: opRead, fd: fd, buf: buf, off: off} }

// Write writes up to len(buf) bytes to fd at offset off, or at the current position when off is
// negative. Like write(2), it may write fewer bytes than asked.
func Write(fd int, buf []byte, off int64) Op { return Op{code: opWrite, fd: fd, buf: buf, off: off} }

// Connect connects the socket fd to sa (a *unix.SockaddrInet4, *unix.SockaddrInet6 or
// *unix.SockaddrUnix). The socket may be blocking or not.
func Connect(fd int, sa unix.Sockaddr) Op { return Op{code: opConnect, fd: fd, sa: sa} }

// Accept accepts one connection on the listening socket fd. flags are accept4(2) flags
// (unix.SOCK_NONBLOCK, unix.SOCK_CLOEXEC). Result.N is the new descriptor, which the caller
// owns.
func Accept(fd int, flags int) Op { return Op{code: opAccept, fd: fd, flags: flags} }

// Timeout completes with a zero Result after d has elapsed (CLOCK_MONOTONIC).
func Timeout(d time.Duration) Op { return Op{code: opTimeout, dur: max(d, 0)} }

// Backend names the implementation behind a Reactor.
type Backend uint8

const (
	// BackendAuto uses io_uring when Available reports that it works, and the pool otherwise.
	BackendAuto Backend = iota
	// BackendIOUring requires io_uring: New fails with ErrUnavailable where it does not work.
	BackendIOUring
	// BackendPool uses the portable goroutine pool doing pread/pwrite and friends, even where
	// io_uring works. Tests force it to cover the fallback path on io_uring machines.
	BackendPool
)

// String returns "auto", "io_uring" or "pool".
func (b Backend) String() string {
	switch b {
	case BackendAuto:
		return "auto"
	case BackendIOUring:
		return "io_uring"
	case BackendPool:
		return "pool"
	}
	return fmt.Sprintf("Backend(%d)", uint8(b))
}

// DefaultBackend is the backend New uses when no WithBackend option is given.
//
// It is the pool, not io_uring, because BenchmarkBlockRead showed io_uring losing on blocks in
// the page cache (0.62-0.91 of the pool's rate), the state tier's common case, and winning only
// on uncached blocks (1.3-2.3 from 16 reads outstanding); see DESIGN.md. io_uring stays an
// explicit opt-in until a benchmark on the target machines says otherwise.
const DefaultBackend = BackendPool

// Option configures a Reactor or BlockReader.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithBackend selects the implementation. The default is DefaultBackend.
func WithBackend(b Backend) Option { return optionFunc(func(c *config) { c.backend = b }) }

// WithEntries sets the io_uring ring size: the number of bounded operations (file reads and
// writes at an offset, Nop) the kernel holds at once. Operations beyond it wait in a FIFO in the
// process; open-ended ones (sockets, pipes, Accept, Connect, Timeout) never wait and do not
// count (see Backpressure in the package documentation). Default 256; clamped to [1, 4096].
func WithEntries(n int) Option { return optionFunc(func(c *config) { c.entries = n }) }

// WithWorkers sets the number of pool goroutines for bounded operations, which bounds the
// pool's concurrent file reads and writes; each open-ended operation gets a goroutine of its
// own. Default 32; clamped to [1, 4096].
func WithWorkers(n int) Option { return optionFunc(func(c *config) { c.workers = n }) }

// WithCloseTimeout bounds how long Close waits for the kernel to finish cancelled io_uring
// operations. Operations still running after it are abandoned: their callbacks get ErrClosed
// and their buffers are kept reachable for the life of the process, because the kernel may
// still write into them. Default 10s.
func WithCloseTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.closeTimeout = d })
}

const (
	defaultEntries      = 256
	defaultWorkers      = 32
	maxEntries          = 4096
	maxWorkers          = 4096
	defaultCloseTimeout = 10 * time.Second
)

type config struct {
	backend      Backend
	entries      int
	workers      int
	closeTimeout time.Duration
}

// newConfig is the one place defaults live.
func newConfig(opts []Option) config {
	c := config{backend: DefaultBackend, entries: defaultEntries, workers: defaultWorkers,
		closeTimeout: defaultCloseTimeout}
	for _, o := range opts {
		o.apply(&c)
	}
	c.entries = min(max(c.entries, 1), maxEntries)
	c.workers = min(max(c.workers, 1), maxWorkers)
	if c.closeTimeout <= 0 {
		c.closeTimeout = defaultCloseTimeout
	}
	return c
}

// Reactor runs operations asynchronously and reports each completion once. All methods are
// safe for concurrent use.
type Reactor struct {
	e       engine
	backend Backend
}

// engine is a Reactor implementation: the io_uring ring or the goroutine pool.
type engine interface {
	// submit starts o or queues it; it never blocks on capacity.
	submit(o *opState) error
	// cancel asks for o to finish early. o still completes exactly once. Only an operation
	// submit has accepted can be cancelled; before that, cancel does nothing.
	cancel(o *opState)
	close() error
}

// New returns a Reactor on the backend the options select.
func New(opts ...Option) (*Reactor, error) {
	c := newConfig(opts)
	switch c.backend {
	case BackendPool:
		return &Reactor{e: newPool(c), backend: BackendPool}, nil
	case BackendIOUring, BackendAuto:
		err := Available()
		if err == nil {
			var e engine
			if e, err = newRingEngine(c); err == nil {
				return &Reactor{e: e, backend: BackendIOUring}, nil
			}
		}
		if c.backend == BackendIOUring {
			return nil, err
		}
		return &Reactor{e: newPool(c), backend: BackendPool}, nil
	}
	return nil, fmt.Errorf("uring: unknown backend %v", c.backend)
}

// Backend reports which implementation runs the operations: BackendIOUring or BackendPool.
func (r *Reactor) Backend() Backend { return r.backend }

// Submit starts op and returns without waiting for it. done is called exactly once with the
// result, on a goroutine of the reactor's (never the caller's, during Submit), unless Submit
// returns an error, in which case done is not called.
//
// Submit never blocks on capacity: beyond WithEntries (io_uring) or WithWorkers (pool) bounded
// operations, it queues op in FIFO order. That is what makes it safe to call from inside a
// done callback, the natural place to chain the next read. Open-ended operations (a Read or
// Write with a negative offset, Accept, Connect, Timeout) are never queued, since what they
// wait for may depend on an operation behind them. Callers bound their own outstanding work
// (the state tier bounds its fetches); the reactor bounds the file I/O that reaches the kernel.
//
// done runs on the io_uring backend's single dispatch goroutine. While it runs, no other
// completion is delivered and submissions from other goroutines wait to be flushed with the
// batch, so it must neither block nor compute for long (decompressing a block, say): hand
// such work to another goroutine. It must not call Do or Close, which would wait for itself.
//
// Submit returns ErrClosed after Close, and syscall.EAFNOSUPPORT for a Connect to an address
// family other than inet, inet6 and unix.
func (r *Reactor) Submit(op Op, done func(Result)) error {
	o, err := newOpState(op, done)
	if err != nil {
		return err
	}
	return r.e.submit(o)
}

// Do runs op and waits for its result. If ctx ends first, Do cancels the operation and still
// waits for it to finish, because until then the kernel may write into op's buffer; it
// returns ctx.Err() if the cancellation took effect, or the operation's own result if it
// finished first. Do must not be called from a done callback.
func (r *Reactor) Do(ctx context.Context, op Op) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	ch := make(chan Result, 1)
	o, err := newOpState(op, func(res Result) { ch <- res })
	if err != nil {
		return 0, err
	}
	if err := r.e.submit(o); err != nil {
		return 0, err
	}
	select {
	case res := <-ch:
		return res.N, res.Err
	case <-ctx.Done():
		r.e.cancel(o)
		res := <-ch
		if errors.Is(res.Err, syscall.ECANCELED) {
			return res.N, ctx.Err()
		}
		return res.N, res.Err
	}
}

// Close stops the reactor. Operations still queued or in flight complete with ErrClosed (or
// their real result, if they finish before the cancellation reaches them); Close returns
// after every callback has been called, unless WithCloseTimeout expired first. A second Close
// returns ErrClosed.
//
// On the pool backend, an operation blocked in a system call on a blocking descriptor (a read
// of a socket without data, say) cannot be interrupted; Close waits for it. Use non-blocking
// sockets with the pool, as the io_uring backend does not care.
func (r *Reactor) Close() error { return r.e.close() }

// opPhase is where an operation is in its life. Guarded by the owning engine's lock.
type opPhase uint8

const (
	phaseQueued  opPhase = iota // waiting in the engine's FIFO
	phaseRunning                // handed to the kernel (ring) or a worker or timer (pool)
	phaseDone                   // result delivered or about to be; nothing may touch it again
)

// opState is one submitted operation. It is the thing that keeps kernel-visible memory alive:
// from submission to completion an opState is reachable from its engine (the ring's slot table
// or the pool's queue, worker or timer), and it references the buffer and the argument
// structures whose addresses the kernel holds.
type opState struct {
	Op
	done func(Result)

	phase opPhase // INVARIANT: guarded by the engine's mutex

	// Ring engine. rsa and ts are argument structures the kernel reads during the operation
	// (not only at submission on kernels without IORING_FEAT_SUBMIT_STABLE).
	slot, gen uint32
	rsa       *unix.RawSockaddrAny
	rsaLen    uint32
	ts        *kernelTimespec
	pin       runtime.Pinner

	// Pool engine.
	canceled atomic.Bool
	timer    *time.Timer
}

// openEnded reports whether the operation may stay in the kernel for as long as something
// outside this process takes: a read or write at the current position (a socket or pipe waits
// for its peer), an accept, a connect, a timer. The engines never make such an operation wait
// for capacity behind others. A queue would let a socket read take the last slot while the write
// that makes its peer answer waits behind it, forever: the hang BenchmarkTransport in
// host/lookup hit with 256 keep-alive connections, each with a read always pending, on a ring
// of 256 entries.
//
// Reads and writes with an offset are the bounded kind: a file's pread completes on its own.
// A positional read of a socket is not supported (the pool's pread fails with ESPIPE), which
// is what makes the offset a sound test.
func (o *Op) openEnded() bool {
	switch o.code {
	case opRead, opWrite:
		return o.off < 0
	case opAccept, opConnect, opTimeout:
		return true
	}
	return false
}

func newOpState(op Op, done func(Result)) (*opState, error) {
	if done == nil {
		done = func(Result) {}
	}
	if op.code == opConnect {
		switch op.sa.(type) {
		case *unix.SockaddrInet4, *unix.SockaddrInet6, *unix.SockaddrUnix:
		default:
			return nil, syscall.EAFNOSUPPORT
		}
	}
	if len(op.buf) > maxRW {
		// read(2) and write(2) move at most maxRW bytes at once anyway; clipping here keeps the
		// 32-bit SQE length from wrapping, and the short count tells the caller as read(2) would.
		op.buf = op.buf[:maxRW]
	}
	return &opState{Op: op, done: done}, nil
}

// kernelTimespec is struct __kernel_timespec: 64-bit fields on every architecture, unlike
// unix.Timespec on 32-bit ones.
type kernelTimespec struct {
	sec  int64
	nsec int64
}

// maxRW is Linux's MAX_RW_COUNT, the largest single read or write.
const maxRW = math.MaxInt32 &^ 4095

// fifo is an unbounded first-in first-out queue of operations waiting for capacity.
type fifo struct {
	items []*opState
	head  int
}

func (q *fifo) len() int { return len(q.items) - q.head }

func (q *fifo) push(o *opState) { q.items = append(q.items, o) }

func (q *fifo) pop() *opState {
	o := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	switch {
	case q.head == len(q.items):
		q.items, q.head = q.items[:0], 0
	case q.head >= 1024 && q.head*2 >= len(q.items):
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	return o
}

// remove takes o out of the queue, reporting whether it was there.
func (q *fifo) remove(o *opState) bool {
	for i := q.head; i < len(q.items); i++ {
		if q.items[i] == o {
			copy(q.items[i:], q.items[i+1:])
			q.items[len(q.items)-1] = nil
			q.items = q.items[:len(q.items)-1]
			return true
		}
	}
	return false
}

// drain empties the queue and returns what was in it, oldest first.
func (q *fifo) drain() []*opState {
	out := append([]*opState(nil), q.items[q.head:]...)
	clear(q.items)
	q.items, q.head = nil, 0
	return out
}
