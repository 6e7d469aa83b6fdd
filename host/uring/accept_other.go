//go:build unix && !linux

package uring

import "golang.org/x/sys/unix"

// accept stands in for accept4(2) where it does not exist. The flags are Linux's and are
// ignored; the new descriptor is always close-on-exec, set after the fact, which leaves a
// window in which a concurrent fork+exec could inherit it.
func accept(fd, _ int) (int, error) {
	nfd, _, err := unix.Accept(fd)
	if err != nil {
		return -1, err
	}
	unix.CloseOnExec(nfd)
	return nfd, nil
}
