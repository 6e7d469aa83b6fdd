//go:build unix

package uring

import (
	"errors"
	"io"
	"syscall"
)

// BlockReader reads blocks of files asynchronously, for the state tier's segment files.
//
// It is an interface so that the state tier can wrap it (fault injection, metrics); the
// implementations in this package are NewBlockReader's.
type BlockReader interface {
	// ReadAt reads len(buf) bytes from fd at offset off, then calls done exactly once.
	//
	// The result follows io.ReaderAt: n == len(buf) and err == nil, or n < len(buf) and a
	// non-nil err, which is io.EOF when the file ends first, ErrClosed after Close, or a
	// syscall.Errno. Short reads are retried for the rest of the block.
	//
	// ReadAt never blocks on I/O. done runs on a goroutine of the reader's, never on the
	// caller's during ReadAt, and possibly before ReadAt returns. It may call ReadAt again,
	// but must neither block nor compute for long: on io_uring every completion is delivered
	// by one goroutine (see Reactor.Submit). buf must not be touched and fd must stay open
	// until done runs. Safe for concurrent use.
	ReadAt(fd int, buf []byte, off int64, done func(n int, err error))

	// Close waits for outstanding reads to complete or fail with ErrClosed, and releases the
	// reader.
	Close() error
}

// NewBlockReader returns a BlockReader on its own Reactor (see New for the options). With
// the default options that is the pread pool; WithBackend(BackendAuto) takes io_uring where
// Available reports it works.
func NewBlockReader(opts ...Option) (BlockReader, error) {
	r, err := New(opts...)
	if err != nil {
		return nil, err
	}
	return &blockReader{r: r}, nil
}

type blockReader struct{ r *Reactor }

var errNegativeOffset = errors.New("uring: negative offset")

func (b *blockReader) ReadAt(fd int, buf []byte, off int64, done func(int, error)) {
	if off < 0 {
		go done(0, errNegativeOffset)
		return
	}
	rd := &blockRead{r: b.r, fd: fd, buf: buf, off: off, done: done}
	rd.next()
}

func (b *blockReader) Close() error { return b.r.Close() }

// blockRead is one ReadAt in progress: it resubmits after a short read.
type blockRead struct {
	r    *Reactor
	fd   int
	buf  []byte
	off  int64
	n    int
	done func(int, error)
}

func (rd *blockRead) next() {
	if err := rd.r.Submit(Read(rd.fd, rd.buf[rd.n:], rd.off+int64(rd.n)), rd.complete); err != nil {
		go rd.done(rd.n, err) // keep the promise not to call done on the caller's goroutine
	}
}

func (rd *blockRead) complete(res Result) {
	rd.n += res.N
	switch {
	case res.Err == syscall.EINTR || res.Err == syscall.EAGAIN:
		rd.next()
	case res.Err != nil:
		rd.done(rd.n, res.Err)
	case rd.n == len(rd.buf):
		rd.done(rd.n, nil)
	case res.N == 0:
		rd.done(rd.n, io.EOF)
	default:
		rd.next() // short read inside the file
	}
}
