//go:build linux

package uring

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// forEachBackend runs fn once per backend, with the option that forces it. The pool case is
// what covers the fallback path on machines where io_uring works; the io_uring case is
// skipped, with the reason, where it does not.
func forEachBackend(t *testing.T, fn func(t *testing.T, force Option)) {
	for _, b := range []Backend{BackendIOUring, BackendPool} {
		t.Run(b.String(), func(t *testing.T) {
			if b == BackendIOUring {
				if err := Available(); err != nil {
					t.Skipf("io_uring unavailable here: %v", err)
				}
			}
			fn(t, WithBackend(b))
		})
	}
}

func newReactor(t testing.TB, opts ...Option) *Reactor {
	t.Helper()
	r, err := New(opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// tempFile returns an open file holding size random bytes, and those bytes.
func tempFile(t testing.TB, size int) (*os.File, []byte) {
	t.Helper()
	data := make([]byte, size)
	rng := rand.NewChaCha8([32]byte{1})
	_, _ = rng.Read(data)
	path := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, data
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestNop(t *testing.T) {
	forEachBackend(t, func(t *testing.T, force Option) {
		r := newReactor(t, force)
		if n, err := r.Do(context.Background(), Nop()); n != 0 || err != nil {
			t.Fatalf("Do(Nop) = %d, %v", n, err)
		}
		ch := make(chan Result, 1)
		if err := r.Submit(Nop(), func(res Result) { ch <- res }); err != nil {
			t.Fatal(err)
		}
		if res := <-ch; res != (Result{}) {
			t.Fatalf("Submit(Nop) completed with %+v", res)
		}
	})
}

func TestBackendSelection(t *testing.T) {
	r := newReactor(t, WithBackend(BackendPool))
	if r.Backend() != BackendPool {
		t.Fatalf("forced pool, got %v", r.Backend())
	}
	auto := newReactor(t, WithBackend(BackendAuto))
	want := BackendPool
	if Available() == nil {
		want = BackendIOUring
	}
	if auto.Backend() != want {
		t.Fatalf("auto picked %v, want %v (Available: %v)", auto.Backend(), want, Available())
	}
	if def := newReactor(t); def.Backend() != BackendPool && DefaultBackend == BackendPool {
		t.Fatalf("default picked %v, want %v", def.Backend(), DefaultBackend)
	}
	if err := Available(); err != nil {
		if _, err2 := New(WithBackend(BackendIOUring)); !errors.Is(err2, ErrUnavailable) {
			t.Fatalf("New(io_uring) where unavailable: %v, want ErrUnavailable", err2)
		}
	}
}

func TestConcurrentReads(t *testing.T) {
	forEachBackend(t, func(t *testing.T, force Option) {
		f, data := tempFile(t, 1<<20)
		r := newReactor(t, force, WithEntries(32), WithWorkers(8))
		const goroutines, reads = 16, 200
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 7))
				for i := range reads {
					off := rng.IntN(len(data))
					buf := make([]byte, rng.IntN(8192)+1)
					want := data[off:min(off+len(buf), len(data))]
					var n int
					var err error
					if i%2 == 0 {
						n, err = r.Do(context.Background(), Read(int(f.Fd()), buf, int64(off)))
					} else {
						ch := make(chan Result, 1)
						if err := r.Submit(Read(int(f.Fd()), buf, int64(off)), func(res Result) { ch <- res }); err != nil {
							t.Error(err)
							return
						}
						res := <-ch
						n, err = res.N, res.Err
					}
					if err != nil || !bytes.Equal(buf[:n], want) {
						t.Errorf("read %d bytes at %d: n=%d err=%v, content match %v", len(buf), off, n, err, bytes.Equal(buf[:n], want))
						return
					}
				}
			})
		}
		wg.Wait()
	})
}

func TestWriteThenRead(t *testing.T) {
	forEachBackend(t, func(t *testing.T, force Option) {
		r := newReactor(t, force)
		ctx := ctxTimeout(t, 10*time.Second)
		f, err := os.Create(filepath.Join(t.TempDir(), "w"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fd := int(f.Fd())
		blocks := [][]byte{[]byte("hello, "), []byte("io_uring "), []byte("world")}
		off := 0
		for _, b := range blocks {
			if n, err := r.Do(ctx, Write(fd, b, int64(off))); n != len(b) || err != nil {
				t.Fatalf("Write at %d = %d, %v", off, n, err)
			}
			off += len(b)
		}
		got := make([]byte, off+10)
		n, err := r.Do(ctx, Read(fd, got, 0))
		if err != nil || string(got[:n]) != "hello, io_uring world" {
			t.Fatalf("Read = %q, %v", got[:n], err)
		}
		if n, err := r.Do(ctx, Read(fd, got, int64(off))); n != 0 || err != nil {
			t.Fatalf("Read at EOF = %d, %v; want 0, nil", n, err)
		}

		// Offset -1: the descriptor's position, as on a pipe.
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(p[0])
		defer unix.Close(p[1])
		readDone := make(chan Result, 1)
		pbuf := make([]byte, 64)
		if err := r.Submit(Read(p[0], pbuf, -1), func(res Result) { readDone <- res }); err != nil {
			t.Fatal(err)
		}
		if n, err := r.Do(ctx, Write(p[1], []byte("through the pipe"), -1)); n != 16 || err != nil {
			t.Fatalf("pipe Write = %d, %v", n, err)
		}
		if res := <-readDone; res.Err != nil || string(pbuf[:res.N]) != "through the pipe" {
			t.Fatalf("pipe Read = %q, %v", pbuf[:res.N], res.Err)
		}
	})
}

func TestErrorsAreErrno(t *testing.T) {
	forEachBackend(t, func(t *testing.T, force Option) {
		r := newReactor(t, force)
		_, err := r.Do(context.Background(), Read(1<<20, make([]byte, 8), 0))
		var errno syscall.Errno
		if !errors.As(err, &errno) || errno != syscall.EBADF {
			t.Fatalf("read of a bad descriptor: %v (%T), want syscall.EBADF", err, err)
		}
		if err := r.Submit(Connect(0, &unix.SockaddrNetlink{}), nil); err != syscall.EAFNOSUPPORT {
			t.Fatalf("Connect to a netlink address: %v, want EAFNOSUPPORT", err)
		}
	})
}

func TestTimeout(t *testing.T) {
	forEachBackend(t, func(t *testing.T, force Option) {
		r := newReactor(t, force)
		if n, err := r.Do(context.Background(), Timeout(30*time.Millisecond)); n != 0 || err != nil {
			t.Fatalf("Timeout = %d, %v", n, err)
		}

		// Cancellation through the context: the hour-long timer ends when the context does
		// (were it not cancelled, the test would hang until go test's own timeout).
		ctx := ctxTimeout(t, 20*time.Millisecond)
		_, err := r.Do(ctx, Timeout(time.Hour))
		if !errors.Is(err, context.DeadlineExceeded) || ctx.Err() == nil {
			t.Fatalf("cancelled Timeout: %v (context: %v), want context.DeadlineExceeded", err, ctx.Err())
		}
	})
}

// listen returns a non-blocking TCP listener on 127.0.0.1 and its address.
func listen(t testing.TB) (int, *unix.SockaddrInet4) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fd, sa.(*unix.SockaddrInet4)
}

func socket(t testing.TB) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func TestConnectAccept(t *testing.T) {
	forEachBackend(t, func(t *testing.T, force Option) {
		r := newReactor(t, force)
		ctx := ctxTimeout(t, 10*time.Second)
		lfd, addr := listen(t)

		accepted := make(chan Result, 1)
		if err := r.Submit(Accept(lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC), func(res Result) { accepted <- res }); err != nil {
			t.Fatal(err)
		}
		cfd := socket(t)
		if _, err := r.Do(ctx, Connect(cfd, addr)); err != nil {
			t.Fatalf("Connect: %v", err)
		}
		res := <-accepted
		if res.Err != nil {
			t.Fatalf("Accept: %v", res.Err)
		}
		sfd := res.N
		defer unix.Close(sfd)

		msg := []byte("ping over loopback")
		got := make([]byte, 64)
		readDone := make(chan Result, 1)
		if err := r.Submit(Read(sfd, got, -1), func(res Result) { readDone <- res }); err != nil {
			t.Fatal(err)
		}
		if n, err := r.Do(ctx, Write(cfd, msg, -1)); n != len(msg) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		if res := <-readDone; res.Err != nil || !bytes.Equal(got[:res.N], msg) {
			t.Fatalf("Read = %q, %v", got[:res.N], res.Err)
		}

		// A port nobody listens on: the kernel's ECONNREFUSED, as a syscall.Errno.
		unix.Close(lfd)
		_, err := r.Do(ctx, Connect(socket(t), addr))
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("Connect to a closed port: %v, want ECONNREFUSED", err)
		}

		// An accept nobody will satisfy ends with the context.
		lfd2, _ := listen(t)
		if _, err := r.Do(ctxTimeout(t, 20*time.Millisecond), Accept(lfd2, 0)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("cancelled Accept: %v, want DeadlineExceeded", err)
		}
		if _, err := r.Do(ctx, Nop()); err != nil {
			t.Fatalf("reactor unusable after a cancellation: %v", err)
		}
	})
}

// TestBackpressure floods a tiny reactor from many goroutines, and from its own callbacks:
// everything completes, nothing deadlocks, and the kernel (or the pool) never holds more
// than the configured number of operations.
func TestBackpressure(t *testing.T) {
	forEachBackend(t, func(t *testing.T, force Option) {
		f, data := tempFile(t, 64<<10)
		const limit, workers = 4, 2
		r := newReactor(t, force, WithEntries(limit), WithWorkers(workers))
		const submitters, each, chained = 16, 300, 50
		var completed atomic.Int64
		var wg sync.WaitGroup
		verify := func(buf []byte, off int, res Result) {
			if res.Err != nil || !bytes.Equal(buf[:res.N], data[off:off+len(buf)]) {
				t.Errorf("read at %d: %+v", off, res)
			}
		}
		for g := range submitters {
			wg.Go(func() {
				var mine sync.WaitGroup
				for i := range each {
					off := (g*each + i) * 16 % (len(data) - 16)
					buf := make([]byte, 16)
					mine.Add(1)
					err := r.Submit(Read(int(f.Fd()), buf, int64(off)), func(res Result) {
						verify(buf, off, res)
						completed.Add(1)
						mine.Done()
					})
					if err != nil {
						t.Error(err)
						mine.Done()
					}
				}
				mine.Wait()
			})
		}
		// A chain where each completion submits the next: on the io_uring backend this runs
		// on the dispatch goroutine while the ring is full, the case a blocking Submit would
		// deadlock.
		chainDone := make(chan struct{})
		var step func(i int)
		step = func(i int) {
			if i == chained {
				close(chainDone)
				return
			}
			buf := make([]byte, 16)
			err := r.Submit(Read(int(f.Fd()), buf, int64(i*16)), func(res Result) {
				verify(buf, i*16, res)
				completed.Add(1)
				step(i + 1)
			})
			if err != nil {
				t.Error(err)
				close(chainDone)
			}
		}
		step(0)

		waitOrFail(t, 30*time.Second, "flood", func() { wg.Wait(); <-chainDone })
		if got := completed.Load(); got != submitters*each+chained {
			t.Fatalf("%d completions, want %d", got, submitters*each+chained)
		}
		bound := int64(limit)
		if r.Backend() == BackendPool {
			bound = workers
		}
		if peak := maxConcurrency(r); peak > bound {
			t.Fatalf("%d operations in flight at once, limit %d", peak, bound)
		} else {
			t.Logf("peak concurrency %d (limit %d)", peak, bound)
		}
	})
}

func waitOrFail(t testing.TB, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { fn(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		buf := make([]byte, 1<<20)
		t.Fatalf("%s: no progress after %v\n%s", what, d, buf[:runtime.Stack(buf, true)])
	}
}

// TestCloseInFlight closes a reactor holding operations that would never finish on their own.
// Close returns promptly, every callback runs exactly once with ErrClosed (or its real
// result), later submissions fail, and no goroutine is left behind.
func TestCloseInFlight(t *testing.T) {
	forEachBackend(t, func(t *testing.T, force Option) {
		baseline := runtime.NumGoroutine()
		lfd, _ := listen(t)
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(p[0])
		defer unix.Close(p[1])
		f, _ := tempFile(t, 1<<20)

		r, err := New(force, WithEntries(16), WithWorkers(4))
		if err != nil {
			t.Fatal(err)
		}
		var calls [64]atomic.Int32
		var results [64]Result
		ops := make([]Op, 0, 64)
		for range 8 {
			ops = append(ops, Accept(lfd, 0), Timeout(time.Hour), Read(p[0], make([]byte, 8), -1))
		}
		for len(ops) < len(calls) {
			ops = append(ops, Read(int(f.Fd()), make([]byte, 4096), int64(len(ops))*4096))
		}
		const blocking = 24 // ops[:24] never finish on their own; the file reads after them do
		var readsDone atomic.Int32
		allRead := make(chan struct{})
		for i, op := range ops {
			if err := r.Submit(op, func(res Result) {
				results[i] = res
				calls[i].Add(1)
				if i >= blocking && readsDone.Add(1) == int32(len(ops)-blocking) {
					close(allRead)
				}
			}); err != nil {
				t.Fatal(err)
			}
		}
		// The reactor takes operations in order, so once every read submitted after the
		// blocking ones has completed, those are in the kernel or on a goroutine of their own.
		waitOrFail(t, 10*time.Second, "the file reads", func() { <-allRead })

		waitOrFail(t, 5*time.Second, "Close", func() {
			if err := r.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		for i := range ops {
			if c := calls[i].Load(); c != 1 {
				t.Errorf("op %d (%v): done called %d times", i, ops[i], c)
			}
			if i < blocking && !errors.Is(results[i].Err, ErrClosed) {
				t.Errorf("op %d (%v): %+v, want ErrClosed", i, ops[i], results[i])
			}
			if i >= blocking && (results[i].Err != nil || results[i].N != 4096) {
				t.Errorf("op %d (%v): %+v, want a full 4096-byte read", i, ops[i], results[i])
			}
		}
		if err := r.Submit(Nop(), nil); !errors.Is(err, ErrClosed) {
			t.Errorf("Submit after Close: %v", err)
		}
		if _, err := r.Do(context.Background(), Nop()); !errors.Is(err, ErrClosed) {
			t.Errorf("Do after Close: %v", err)
		}
		if err := r.Close(); !errors.Is(err, ErrClosed) {
			t.Errorf("second Close: %v", err)
		}
		for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > baseline; {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Fatalf("%d goroutines after Close, %d before New\n%s", runtime.NumGoroutine(), baseline, buf[:runtime.Stack(buf, true)])
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// TestHammer mixes every operation, cancellations, chained submissions and a Close racing with
// submitters, under -race. Every accepted submission must complete exactly once.
func TestHammer(t *testing.T) {
	forEachBackend(t, func(t *testing.T, force Option) {
		f, data := tempFile(t, 256<<10)
		r, err := New(force, WithEntries(8), WithWorkers(4))
		if err != nil {
			t.Fatal(err)
		}
		var accepted, completed atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 99))
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					off := rng.IntN(len(data) - 512)
					buf := make([]byte, 512)
					var op Op
					switch rng.IntN(5) {
					case 0:
						op = Nop()
					case 1:
						op = Timeout(time.Duration(rng.IntN(200)) * time.Microsecond)
					case 2:
						// Do with a context that may expire mid-flight.
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(100))*time.Microsecond)
						n, err := r.Do(ctx, Read(int(f.Fd()), buf, int64(off)))
						cancel()
						if err == nil && !bytes.Equal(buf[:n], data[off:off+n]) {
							t.Errorf("Do read mismatch at %d", off)
						}
						continue
					default:
						op = Read(int(f.Fd()), buf, int64(off))
					}
					chain := rng.IntN(4) == 0
					var done func(Result)
					done = func(res Result) {
						if op.code == opRead && res.Err == nil && !bytes.Equal(buf[:res.N], data[off:off+res.N]) {
							t.Errorf("read mismatch at %d", off)
						}
						completed.Add(1)
						if chain {
							chain = false
							if r.Submit(Nop(), done) == nil {
								accepted.Add(1)
							}
						}
					}
					if err := r.Submit(op, done); err == nil {
						accepted.Add(1)
					} else if !errors.Is(err, ErrClosed) {
						t.Errorf("Submit: %v", err)
					}
				}
			})
		}
		// Close while the submitters are still going: once they have a few thousand
		// completions behind them (a signal that the load runs, not a period of time).
		for deadline := time.Now().Add(10 * time.Second); completed.Load() < 2000; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) { // a hang detector, not a speed check
				close(stop)
				r.Close()
				t.Fatalf("%d completions after 10s", completed.Load())
			}
		}
		waitOrFail(t, 10*time.Second, "Close under load", func() {
			if err := r.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		close(stop)
		wg.Wait()
		if a, c := accepted.Load(), completed.Load(); a != c {
			t.Fatalf("%d submissions accepted, %d completed", a, c)
		} else {
			t.Logf("%d operations", a)
		}
	})
}

func TestBlockReader(t *testing.T) {
	forEachBackend(t, func(t *testing.T, force Option) {
		const size = 100_000 // not a multiple of the block size
		f, data := tempFile(t, size)
		br, err := NewBlockReader(force, WithEntries(16))
		if err != nil {
			t.Fatal(err)
		}
		type read struct {
			n   int
			err error
		}
		readAt := func(buf []byte, off int64) read {
			ch := make(chan read, 1)
			br.ReadAt(int(f.Fd()), buf, off, func(n int, err error) { ch <- read{n, err} })
			return <-ch
		}

		const block = 4096
		var wg sync.WaitGroup
		for off := 0; off < size; off += block {
			wg.Go(func() {
				buf := make([]byte, block)
				got := readAt(buf, int64(off))
				want := data[off:min(off+block, size)]
				wantErr := error(nil)
				if len(want) < block {
					wantErr = io.EOF
				}
				if got.n != len(want) || got.err != wantErr || !bytes.Equal(buf[:got.n], want) {
					t.Errorf("block at %d: n=%d err=%v, want n=%d err=%v", off, got.n, got.err, len(want), wantErr)
				}
			})
		}
		wg.Wait()
		if got := readAt(make([]byte, 10), size+5); got.n != 0 || got.err != io.EOF {
			t.Errorf("read past EOF: %+v", got)
		}
		if got := readAt(make([]byte, 10), -1); got.err == nil {
			t.Errorf("negative offset accepted")
		}
		if got := readAt(nil, 0); got.n != 0 || got.err != nil {
			t.Errorf("empty read: %+v", got)
		}
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
		if got := readAt(make([]byte, 10), 0); !errors.Is(got.err, ErrClosed) {
			t.Errorf("read after Close: %+v", got)
		}
	})
}

func TestFIFO(t *testing.T) {
	var q fifo
	ops := make([]*opState, 3000)
	for i := range ops {
		ops[i] = &opState{}
		q.push(ops[i])
	}
	if !q.remove(ops[5]) || q.remove(ops[5]) {
		t.Fatal("remove")
	}
	for i := range ops {
		if i == 5 {
			continue
		}
		if got := q.pop(); got != ops[i] {
			t.Fatalf("pop %d: wrong element", i)
		}
	}
	if q.len() != 0 {
		t.Fatalf("len %d after draining", q.len())
	}
}
