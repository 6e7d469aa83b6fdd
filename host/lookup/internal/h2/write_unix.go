//go:build unix

package h2

import (
	"net"
	"syscall"
)

// rawConn returns nc's descriptor for non-blocking writes, or nil if it has none.
func rawConn(nc net.Conn) syscall.RawConn {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// tryWrite writes b with one non-blocking system call; a full socket buffer is no error.
func (c *conn) tryWrite(b []byte) (n int, err error) {
	rerr := c.rc.Write(func(fd uintptr) bool {
		for {
			n, err = syscall.Write(int(fd), b)
			if err != syscall.EINTR {
				break
			}
		}
		if err == syscall.EAGAIN {
			err = nil
		}
		n = max(n, 0)
		return true // never wait for the socket: the writer goroutine does
	})
	if err == nil {
		err = rerr
	}
	return n, err
}
