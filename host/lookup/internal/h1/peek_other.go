//go:build !unix

package h1

import "net"

func peekIdle(net.Conn) (alive, checked bool) { return false, false }
