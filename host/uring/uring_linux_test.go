package uring

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxConcurrency is the most operations the reactor has held in the kernel (io_uring) or in
// workers (pool) at once.
func maxConcurrency(r *Reactor) int64 {
	switch e := r.e.(type) {
	case *ringEngine:
		return e.maxInflight.Load()
	case *poolEngine:
		return e.maxRunning.Load()
	}
	panic("unknown engine")
}

// reactorState describes what r holds, for failure messages.
func reactorState(r *Reactor) string {
	count := func(ops []*opState) map[string]int {
		m := map[string]int{}
		for _, o := range ops {
			if o != nil {
				m[o.Op.String()]++
			}
		}
		return m
	}
	switch e := r.e.(type) {
	case *ringEngine:
		e.mu.Lock()
		defer e.mu.Unlock()
		return fmt.Sprintf("io_uring: %d operations in the kernel %v (%d of %d bounded), %d queued %v",
			e.mu.held, count(e.mu.slots), e.mu.bounded, e.capacity,
			e.mu.queue.len(), count(e.mu.queue.items[e.mu.queue.head:]))
	case *poolEngine:
		e.mu.Lock()
		defer e.mu.Unlock()
		return fmt.Sprintf("pool: %d running, %d queued %v", e.running.Load(), e.mu.queue.len(),
			count(e.mu.queue.items[e.mu.queue.head:]))
	}
	panic("unknown engine")
}

// TestUAPILayout pins the transcribed structs to linux/io_uring.h.
func TestUAPILayout(t *testing.T) {
	var s ioSQE
	var p ioParams
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(io_uring_sqe)", unsafe.Sizeof(s), 64},
		{"sqe.fd", unsafe.Offsetof(s.fd), 4},
		{"sqe.off", unsafe.Offsetof(s.off), 8},
		{"sqe.addr", unsafe.Offsetof(s.addr), 16},
		{"sqe.len", unsafe.Offsetof(s.len), 24},
		{"sqe.rw_flags", unsafe.Offsetof(s.opFlags), 28},
		{"sqe.user_data", unsafe.Offsetof(s.userData), 32},
		{"sqe.buf_index", unsafe.Offsetof(s.bufIndex), 40},
		{"sqe.addr3", unsafe.Offsetof(s.addr3), 48},
		{"sizeof(io_uring_cqe)", unsafe.Sizeof(ioCQE{}), 16},
		{"sizeof(io_sqring_offsets)", unsafe.Sizeof(sqringOffsets{}), 40},
		{"sizeof(io_cqring_offsets)", unsafe.Sizeof(cqringOffsets{}), 40},
		{"sizeof(io_uring_params)", unsafe.Sizeof(p), 120},
		{"params.sq_off", unsafe.Offsetof(p.sqOff), 40},
		{"params.cq_off", unsafe.Offsetof(p.cqOff), 80},
		{"sizeof(__kernel_timespec)", unsafe.Sizeof(kernelTimespec{}), 16},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}

func TestUnavailableReasons(t *testing.T) {
	for _, c := range []struct {
		errno    syscall.Errno
		disabled string
		mention  string
	}{
		{unix.ENOSYS, "", "not implemented"},
		{unix.EPERM, "", "seccomp"},
		{unix.EPERM, "1", "io_uring_disabled=1"},
		{unix.ENOMEM, "", "RLIMIT_MEMLOCK"},
	} {
		err := unavailable(c.errno, c.disabled)
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, c.errno) {
			t.Errorf("%v: %v does not match ErrUnavailable and the errno", c.errno, err)
		}
		if !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%v: %q does not mention %q", c.errno, err, c.mention)
		}
	}
}

func TestRawSockaddr(t *testing.T) {
	rsa, n, err := rawSockaddr(&unix.SockaddrInet4{Port: 0x1234, Addr: [4]byte{127, 0, 0, 1}})
	if err != nil || n != unix.SizeofSockaddrInet4 {
		t.Fatalf("inet4: %d, %v", n, err)
	}
	b := (*[8]byte)(unsafe.Pointer(rsa))
	if want := [8]byte{byte(unix.AF_INET), 0, 0x12, 0x34, 127, 0, 0, 1}; *b != want && !nativeBigEndianFamily(b) {
		t.Fatalf("inet4 bytes % x, want % x", *b, want)
	}
	if _, n, err := rawSockaddr(&unix.SockaddrUnix{Name: "@abstract"}); err != nil || n != 2+9 {
		t.Fatalf("abstract unix: len %d, %v; want 11", n, err)
	}
	if _, n, err := rawSockaddr(&unix.SockaddrUnix{Name: "/tmp/sock"}); err != nil || n != 2+9+1 {
		t.Fatalf("unix path: len %d, %v; want 12", n, err)
	}
	if _, _, err := rawSockaddr(&unix.SockaddrInet4{Port: 1 << 16}); err != unix.EINVAL {
		t.Fatalf("out-of-range port: %v", err)
	}
}

// nativeBigEndianFamily accepts the family in big-endian order, where sa_family is stored
// high byte first.
func nativeBigEndianFamily(b *[8]byte) bool { return b[0] == 0 && b[1] == byte(unix.AF_INET) }

// TestCloseAbandon drives Close past its timeout with operations still in the kernel: with a
// 1ns timeout, Close races the cancellations' completions against abandoning the operations.
// Either way every callback runs exactly once with ErrClosed, and abandoned operations stay
// reachable.
func TestCloseAbandon(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("io_uring unavailable here: %v", err)
	}
	lfd, _ := listen(t)
	abandoned := 0
	for range 20 {
		r := newReactor(t, WithBackend(BackendIOUring), WithEntries(8), WithCloseTimeout(time.Nanosecond))
		var calls [16]atomic.Int32
		var errs [16]error
		for i := range calls {
			op := Accept(lfd, 0)
			if i%2 == 1 {
				op = Timeout(time.Hour)
			}
			if err := r.Submit(op, func(res Result) { errs[i] = res.Err; calls[i].Add(1) }); err != nil {
				t.Fatal(err)
			}
		}
		orphans.Lock()
		before := len(orphans.ops)
		orphans.Unlock()
		waitOrFail(t, 5*time.Second, "Close", func() {
			if err := r.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		orphans.Lock()
		abandoned += len(orphans.ops) - before
		orphans.Unlock()
		for i := range calls {
			if c := calls[i].Load(); c != 1 || !errors.Is(errs[i], ErrClosed) {
				t.Fatalf("op %d: %d calls, last error %v", i, c, errs[i])
			}
		}
	}
	t.Logf("%d operations abandoned over 20 closes", abandoned)
}

// TestCQOverflow has more completions arrive at once than the CQ ring holds, which open-ended
// operations (here timers) make possible since they are not held to WithEntries. The first
// callback holds the dispatch goroutine while the timers fire, so the kernel must park the
// surplus in its overflow list (IORING_FEAT_NODROP), and dispatch must move it in: every
// callback runs once.
func TestCQOverflow(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("io_uring unavailable here: %v", err)
	}
	r := newReactor(t, WithBackend(BackendIOUring), WithEntries(1))
	e := r.e.(*ringEngine)
	n := 16 * int(e.r.cqEntries)
	release := make(chan struct{})
	if err := r.Submit(Nop(), func(Result) { <-release }); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	all := make(chan struct{})
	for range n {
		err := r.Submit(Timeout(time.Millisecond), func(res Result) {
			if res.Err != nil {
				t.Errorf("timer: %v", res.Err)
			}
			if calls.Add(1) == int64(n) {
				close(all)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Wait for the kernel to say it parked completions (IORING_SQ_CQ_OVERFLOW): the timers
	// have fired into a full CQ ring while the dispatcher is held.
	for deadline := time.Now().Add(10 * time.Second); !e.r.overflowed(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) { // a hang detector, not a speed check
			close(release)
			t.Fatalf("no CQ overflow after 10s with %d timers on a CQ ring of %d", n, e.r.cqEntries)
		}
	}
	close(release)
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d of %d timers delivered after 10s (CQ ring of %d): %s", calls.Load(), n, e.r.cqEntries, reactorState(r))
	}
	if e.overflowFlushes.Load() == 0 {
		t.Errorf("%d completions into a CQ ring of %d without an overflow", n, e.r.cqEntries)
	}
	if h := e.maxHeld.Load(); h <= int64(e.capacity) {
		t.Errorf("at most %d operations in the kernel, want more than capacity %d", h, e.capacity)
	}
	t.Logf("%d timers, CQ ring of %d, %d overflow flushes, up to %d in the kernel", n, e.r.cqEntries, e.overflowFlushes.Load(), e.maxHeld.Load())
}
