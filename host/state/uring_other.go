//go:build !unix

package state

import "fmt"

func newUringReader() (blockReader, error) {
	return nil, fmt.Errorf("state: io_uring reads need Linux")
}
