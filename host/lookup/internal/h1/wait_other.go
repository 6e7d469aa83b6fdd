//go:build !unix

package h1

import "syscall"

// writeAwait is not used where there is no poller to wait on: the caller writes with Write.
func writeAwait(syscall.RawConn, *awaiter, []byte, *Attempt) (n int, ok bool, err error) {
	return 0, false, nil
}
