//go:build unix

package uring

import (
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// poolEngine is the portable Reactor: a fixed set of worker goroutines, each running one
// bounded system call (pread, pwrite) at a time, a goroutine of its own for each open-ended
// operation (Op.openEnded: socket reads and writes, accept4, connect), and the runtime timer for
// Timeout. It is what New falls back to where io_uring does not work, and the default backend.
//
// Open-ended operations do not take workers because they may wait indefinitely, and with a
// read pending on every keep-alive connection they would take all of them, leaving the writes
// that make the peers answer queued behind. Each costs a goroutine and, while it waits, an OS
// thread in poll(2): acceptable for the fallback, and bounded by the caller's connections.
//
// An operation on a non-blocking descriptor that would block (EAGAIN, EINPROGRESS) waits in
// poll(2), in slices of pollSlice, so that Do's cancellation and Close are noticed; an
// operation on a blocking descriptor blocks its goroutine until the kernel returns.
type poolEngine struct {
	mu struct {
		sync.Mutex
		closed bool
		queue  fifo
		timers map[*opState]struct{} // armed Timeout operations
	}
	work    *sync.Cond     // on mu: the queue gained an operation, or the pool closed
	closed  atomic.Bool    // mirrors mu.closed for poll loops, which run unlocked
	workers sync.WaitGroup // worker goroutines
	waiters sync.WaitGroup // goroutines running an open-ended operation each
	firing  sync.WaitGroup // armed timers whose callback has not finished

	running, maxRunning atomic.Int64 // operations inside a worker, for tests
}

// pollSlice bounds how long a worker waiting for readiness takes to notice a cancellation.
const pollSlice = 50 * time.Millisecond

func newPool(c config) *poolEngine {
	p := &poolEngine{}
	p.work = sync.NewCond(&p.mu)
	p.mu.timers = make(map[*opState]struct{})
	p.workers.Add(c.workers)
	for range c.workers {
		go p.worker()
	}
	return p
}

func (p *poolEngine) submit(o *opState) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.closed {
		return ErrClosed
	}
	if o.code == opTimeout {
		// A timer, not a worker: sleeping must not take a worker from the reads.
		o.phase = phaseRunning
		p.mu.timers[o] = struct{}{}
		p.firing.Add(1)
		o.timer = time.AfterFunc(o.dur, func() { p.fire(o) }) // fire waits for mu, so o.timer is set first
		return nil
	}
	if o.openEnded() {
		o.phase = phaseRunning
		p.waiters.Go(func() {
			res := p.run(o)
			p.mu.Lock()
			o.phase = phaseDone
			p.mu.Unlock()
			o.done(res)
		})
		return nil
	}
	o.phase = phaseQueued
	p.mu.queue.push(o)
	p.work.Signal()
	return nil
}

func (p *poolEngine) fire(o *opState) {
	defer p.firing.Done()
	p.mu.Lock()
	if o.phase != phaseRunning {
		p.mu.Unlock()
		return
	}
	o.phase = phaseDone
	delete(p.mu.timers, o)
	p.mu.Unlock()
	o.done(Result{})
}

func (p *poolEngine) worker() {
	defer p.workers.Done()
	p.mu.Lock()
	for {
		for p.mu.queue.len() == 0 && !p.mu.closed {
			p.work.Wait()
		}
		if p.mu.queue.len() == 0 {
			p.mu.Unlock()
			return // closed and drained
		}
		o := p.mu.queue.pop()
		o.phase = phaseRunning
		p.mu.Unlock()

		if r := p.running.Add(1); r > p.maxRunning.Load() {
			p.maxRunning.Store(r)
		}
		res := p.run(o)
		p.running.Add(-1)

		p.mu.Lock()
		o.phase = phaseDone
		p.mu.Unlock()
		o.done(res)
		p.mu.Lock()
	}
}

// run performs o with ordinary system calls, retrying EINTR and waiting out EAGAIN.
func (p *poolEngine) run(o *opState) Result {
	var events int16
	switch o.code {
	case opNop:
		return Result{}
	case opConnect:
		return p.connect(o)
	case opRead, opAccept:
		events = unix.POLLIN
	case opWrite:
		events = unix.POLLOUT
	}
	for {
		var n int
		var err error
		switch o.code {
		case opRead:
			if o.off >= 0 {
				n, err = unix.Pread(o.fd, o.buf, o.off)
			} else {
				n, err = unix.Read(o.fd, o.buf)
			}
		case opWrite:
			if o.off >= 0 {
				n, err = unix.Pwrite(o.fd, o.buf, o.off)
			} else {
				n, err = unix.Write(o.fd, o.buf)
			}
		case opAccept:
			n, err = accept(o.fd, o.flags)
		}
		switch err {
		case nil:
			return Result{N: n}
		case unix.EINTR:
		case unix.EAGAIN:
			if err := p.waitReady(o, events); err != nil {
				return Result{Err: err}
			}
		default:
			return Result{Err: err}
		}
	}
}

// connect follows the non-blocking connect protocol (as net does): start it, wait for
// writability, read the outcome from SO_ERROR.
func (p *poolEngine) connect(o *opState) Result {
	switch err := unix.Connect(o.fd, o.sa); err {
	case nil, unix.EISCONN:
		return Result{}
	case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
		// EINTR: the connection continues asynchronously, like EINPROGRESS.
	default:
		return Result{Err: err}
	}
	for {
		if err := p.waitReady(o, unix.POLLOUT); err != nil {
			return Result{Err: err}
		}
		soerr, err := unix.GetsockoptInt(o.fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return Result{Err: err}
		}
		switch e := syscall.Errno(soerr); e {
		case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
			continue
		case 0, unix.EISCONN:
			if _, err := unix.Getpeername(o.fd); err == nil {
				return Result{}
			}
			// Spurious wake-up: not connected yet and no error.
		default:
			return Result{Err: e}
		}
	}
}

// waitReady blocks until fd polls ready for events (or reports an error or hang-up, which the
// retried call then returns), the operation is cancelled, or the pool closes.
func (p *poolEngine) waitReady(o *opState, events int16) error {
	fds := []unix.PollFd{{Fd: int32(o.fd), Events: events}}
	for {
		if o.canceled.Load() {
			return syscall.ECANCELED
		}
		if p.closed.Load() {
			return ErrClosed
		}
		n, err := unix.Poll(fds, int(pollSlice/time.Millisecond))
		switch {
		case err == unix.EINTR:
		case err != nil:
			return err
		case n > 0:
			return nil
		}
	}
}

func (p *poolEngine) cancel(o *opState) {
	p.mu.Lock()
	switch {
	case o.phase == phaseQueued && p.mu.queue.remove(o):
	case o.phase == phaseRunning && o.timer != nil && o.timer.Stop():
		delete(p.mu.timers, o)
		p.firing.Done()
	case o.phase == phaseRunning:
		o.canceled.Store(true) // a worker's poll loop sees it within pollSlice
		p.mu.Unlock()
		return
	default:
		p.mu.Unlock()
		return
	}
	o.phase = phaseDone
	p.mu.Unlock()
	o.done(Result{Err: syscall.ECANCELED})
}

func (p *poolEngine) close() error {
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.mu.closed = true
	p.closed.Store(true)
	dropped := p.mu.queue.drain()
	for o := range p.mu.timers {
		if o.timer.Stop() {
			dropped = append(dropped, o)
			p.firing.Done()
		}
	}
	clear(p.mu.timers)
	for _, o := range dropped {
		o.phase = phaseDone
	}
	p.work.Broadcast()
	p.mu.Unlock()

	for _, o := range dropped {
		o.done(Result{Err: ErrClosed})
	}
	p.workers.Wait()
	p.waiters.Wait()
	p.firing.Wait()
	return nil
}
