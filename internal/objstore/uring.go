//go:build unix

package objstore

import (
	"io"
	"os"
	"runtime"

	"github.com/clink-wasm/clink-wasm/host/uring"
)

// uringReader reads the file pool's immutable objects through io_uring (host/uring,
// experimental). Each read is submitted to the ring and the reading goroutine waits for its
// completion; many concurrent reads share the ring, so they batch into few syscalls.
type uringReader struct{ br uring.BlockReader }

// NewUringReader returns the io_uring block reader for FileOptions.Reader, or an error
// matching uring.ErrUnavailable when io_uring cannot be used in this process.
func NewUringReader() (BlockReader, error) {
	if err := uring.Available(); err != nil {
		return nil, err
	}
	br, err := uring.NewBlockReader(uring.WithBackend(uring.BackendIOUring))
	if err != nil {
		return nil, err
	}
	return &uringReader{br: br}, nil
}

func (u *uringReader) ReadAt(f *os.File, off, n int64) ([]byte, error) {
	buf := make([]byte, n)
	type res struct {
		n   int
		err error
	}
	ch := make(chan res, 1)
	u.br.ReadAt(int(f.Fd()), buf, off, func(n int, err error) { ch <- res{n, err} })
	r := <-ch
	runtime.KeepAlive(f) // the descriptor must stay open until the read completes
	if r.err != nil && !(r.err == io.EOF && r.n == len(buf)) {
		return nil, r.err
	}
	return buf, nil
}

func (u *uringReader) Close() error { return u.br.Close() }
