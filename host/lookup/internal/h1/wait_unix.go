//go:build unix

package h1

import (
	"os"
	"syscall"
	"time"
)

// writeAwait writes b to the connection of rc and then waits until the connection is
// readable (the response's first bytes, or an error, or the deadline), without reading.
//
// Go's Read tries a read before it waits; right after a request's write that read can only
// fail with EAGAIN (no upstream answers within a system call), so it is a system call per
// exchange for nothing. The write is made from inside RawConn.Read's callback because
// RawConn.Read arms the poller before its first call: a response that arrives right after
// the write wakes the wait, where a wait armed after the write could miss it. On the wake-up
// the caller reads as usual (the deadline, a Cancel and a closed connection surface there).
// An event from before the wait (a FIN while the connection was idle) does not wake it: the
// caller uses it only on a connection that was not idle long (conn.awaitOK).
//
// ok reports that the whole of b was written and the wait is over; a is marked sent at the
// write. Otherwise n bytes were written and err is the write's error, if any: with err nil
// the socket's buffer was full (or the wait could not start: n is 0), and the caller
// writes the rest with Write. w is the connection's state for the callback (no allocation
// per exchange).
func writeAwait(rc syscall.RawConn, w *awaiter, b []byte, a *Attempt) (n int, ok bool, err error) {
	if w.fn == nil {
		w.fn = w.callback
	}
	*w = awaiter{b: b, a: a, fn: w.fn}
	_ = rc.Read(w.fn) // the wait's error (deadline, Cancel, close) is the read's too: reported there
	n, ok, err = w.n, w.started && w.n == len(b) && w.err == nil, w.err
	*w = awaiter{fn: w.fn}
	return n, ok, err
}

func (w *awaiter) callback(fd uintptr) bool {
	if w.started {
		return true // readable: the caller's read takes it from here
	}
	w.started = true
	for w.n < len(w.b) {
		m, e := syscall.Write(int(fd), w.b[w.n:])
		if m > 0 {
			w.n += m
		}
		switch {
		case e == syscall.EINTR:
			continue
		case e == syscall.EAGAIN:
			return true
		case e != nil:
			w.err = os.NewSyscallError("write", e)
			return true
		case m == 0:
			w.err = syscall.EIO // a zero-length write of a non-empty buffer: never on a socket
			return true
		}
	}
	w.a.MarkSent(time.Now())
	return false // wait for the response
}
