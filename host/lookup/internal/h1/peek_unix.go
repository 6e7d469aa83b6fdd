//go:build unix

package h1

import (
	"net"
	"syscall"
)

// peekIdle checks an idle connection without blocking: alive means no byte and no
// end-of-file is pending (an idle HTTP/1.1 connection has nothing to say). checked is false
// when the connection offers no file descriptor (a pipe, a custom transport).
func peekIdle(nc net.Conn) (alive, checked bool) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, false
	}
	var buf [1]byte
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		_, _, perr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // never wait
	})
	if err != nil {
		return false, true
	}
	return perr == syscall.EAGAIN || perr == syscall.EWOULDBLOCK, true
}
