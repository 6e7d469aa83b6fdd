//go:build !unix

package objstore

import "errors"

// NewUringReader fails: io_uring reads need Linux.
func NewUringReader() (BlockReader, error) {
	return nil, errors.New("objstore: io_uring reads need Linux")
}
