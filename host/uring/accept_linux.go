package uring

import "golang.org/x/sys/unix"

func accept(fd, flags int) (int, error) {
	nfd, _, err := unix.Accept4(fd, flags)
	return nfd, err
}
