//go:build unix

package state

import (
	"io"
	"os"
	"runtime"

	"github.com/clink-wasm/clink-wasm/host/uring"
)

// uringReader reads segment blocks of the file pool through io_uring (host/uring, experimental).
// Each read is submitted to the ring and the fetching goroutine waits for its completion; many
// concurrent fetches share the ring, so their reads batch into few syscalls.
type uringReader struct{ br uring.BlockReader }

// newUringReader returns the io_uring block reader, or an error matching uring.ErrUnavailable
// when io_uring cannot be used in this process.
func newUringReader() (blockReader, error) {
	if err := uring.Available(); err != nil {
		return nil, err
	}
	br, err := uring.NewBlockReader(uring.WithBackend(uring.BackendIOUring))
	if err != nil {
		return nil, err
	}
	return &uringReader{br: br}, nil
}

func (u *uringReader) readAt(f *os.File, off, n int64) ([]byte, error) {
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

func (u *uringReader) close() error { return u.br.Close() }
