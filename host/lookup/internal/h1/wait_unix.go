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
//
// ok reports that the whole of b was written and the wait is over; a is marked sent at the
// write. Otherwise n bytes were written and err is the write's error, if any: with err nil
// the socket's buffer was full (or the wait could not start: n is 0), and the caller
// writes the rest with Write.
func writeAwait(rc syscall.RawConn, b []byte, a *Attempt) (n int, ok bool, err error) {
	started := false
	rerr := rc.Read(func(fd uintptr) bool {
		if started {
			return true // readable: the caller's read takes it from here
		}
		started = true
		for n < len(b) {
			m, e := syscall.Write(int(fd), b[n:])
			if m > 0 {
				n += m
			}
			switch {
			case e == syscall.EINTR:
				continue
			case e == syscall.EAGAIN:
				return true
			case e != nil:
				err = os.NewSyscallError("write", e)
				return true
			case m == 0:
				err = syscall.EIO // a zero-length write of a non-empty buffer: never on a socket
				return true
			}
		}
		a.MarkSent(time.Now())
		return false // wait for the response
	})
	if !started || n < len(b) || err != nil {
		return n, false, err
	}
	_ = rerr // the wait's error (deadline, Cancel, close) is the read's too: reported there
	return n, true, nil
}
