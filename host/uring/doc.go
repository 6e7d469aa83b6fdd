// Package uring is an experimental io_uring layer for clink-wasm: a completion Reactor for file
// and socket operations, a BlockReader for the state tier's segment files and a Dialer for the
// lookup client, with a portable goroutine pool behind the same API. It talks to the kernel
// through golang.org/x/sys/unix only (io_uring_setup, mmap, io_uring_enter); the ring is
// written here, against linux/io_uring.h.
//
// Experimental means two things. The API may change. And io_uring is not the default: New and
// NewBlockReader use the pread pool (DefaultBackend) unless an option says otherwise.
//
//	br, err := uring.NewBlockReader()                                     // pread pool
//	br, err := uring.NewBlockReader(uring.WithBackend(uring.BackendAuto)) // io_uring where it works
//
// # When io_uring is chosen
//
// Only on request. WithBackend(BackendIOUring) requires it: New fails with an error matching
// ErrUnavailable where it does not work. WithBackend(BackendAuto) takes it when Available
// reports that it works and falls back to the pool otherwise. Available sets up and probes a
// throwaway ring once per process; it fails on kernels before 5.6, under seccomp filters
// (container runtimes block io_uring by default), with the kernel.io_uring_disabled sysctl, and
// in sandboxes such as gVisor.
//
// It is opt-in because BenchmarkBlockRead, which reads random 4 KiB blocks with 1 to 256 reads
// outstanding, did not show it winning where the state tier spends most of its time. On our
// 2-core development VM, for blocks in the page cache it ran at 0.62 to 0.91 times the pread
// pool's rate: a read that hits the cache completes inside io_uring_enter, so batching saves
// only system-call entries, and io_uring's request path costs more than pread's. For blocks
// not in the page cache it ran at 1.3 to 2.3 times the pool's rate with 16 or more reads
// outstanding (about 1.0 with one), since the kernel overlaps the reads without a blocked
// thread per read.
// A deployment whose segment reads mostly miss the page cache (state much larger than memory)
// should measure BackendAuto. DESIGN.md in this directory has the figures and the reasoning.
//
// # Operations and completions
//
// A Reactor runs operations built with Nop, Read, Write, Connect, Accept and Timeout. Submit
// starts one and returns; the reactor then calls its done callback exactly once with a Result.
// Do starts one and waits for it, and cancels it if its context ends first. Errors are the
// kernel's, as syscall.Errno, plus ErrClosed; a cancelled operation reports
// syscall.ECANCELED (Do turns that into the context's error).
//
// The io_uring backend runs all callbacks on a single dispatch goroutine, the only reader of
// the completion ring; the pool runs them on its workers. Either way a callback must neither
// block nor compute for long, since on io_uring it holds up every other completion; it may
// submit more operations, which is the way to chain reads. The dispatch goroutine submits what its callbacks queued with one
// io_uring_enter after they return, so chained reads reach the kernel in batches.
//
// # Backpressure
//
// Submit never blocks. File reads and writes (Read and Write with an offset, and Nop) are
// bounded: the kernel never holds more than WithEntries of them, the pool never runs more than
// WithWorkers at once, and the rest wait in a FIFO inside the reactor. A Submit that blocked
// for room would deadlock the moment a callback, running on the goroutine that frees room,
// submitted into a full ring.
//
// Operations that wait for something outside the process are open-ended and never wait for
// room: Read and Write at the current position (sockets, pipes), Accept, Connect and Timeout
// go to the kernel (or, on the pool, to a goroutine of their own) at once. A socket read may
// be pending for as long as the peer is silent, and the peer may be waiting for a write that a
// FIFO would put behind it: with a read pending on every keep-alive connection, a bound on
// them deadlocks as soon as there are more connections than entries. Sockets and pipes must
// therefore be read and written with a negative offset. Callers bound their own outstanding
// work, as the state tier bounds its fetches and a connection pool its connections.
//
// # Memory the kernel holds
//
// From Submit to the callback, the kernel may read or write the operation's buffer at any
// time: the caller must leave it alone, and on io_uring the reactor keeps it reachable (the
// operation sits in a slot table) and pinned with runtime.Pinner. Do and Reactor.Close wait for
// the kernel to finish, even after a cancellation, for the same reason. If the kernel still
// holds operations when WithCloseTimeout expires, Close gives up on them, reports ErrClosed
// to their callbacks and keeps their buffers reachable for the rest of the process: a bounded
// leak instead of memory corruption.
//
// # Platform
//
// io_uring needs Linux 5.6 or later; the pool works on any Unix, and off Linux it is the only
// backend. Elsewhere (Windows) the package is empty.
//
// # Not implemented
//
// Registered files and buffers, SQPOLL, IORING_SETUP_DEFER_TASKRUN (it needs every submission
// on one OS thread; see DESIGN.md), readv/writev, linked timeouts and multishot operations.
package uring
