//go:build !unix

package h2

import (
	"net"
	"syscall"
)

// rawConn returns nil: without non-blocking writes every write goes through the
// connection's writer goroutine.
func rawConn(net.Conn) syscall.RawConn { return nil }

func (c *conn) tryWrite(b []byte) (int, error) { return 0, nil }
