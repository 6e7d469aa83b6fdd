package lookup

import (
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/h1"
	"golang.org/x/sys/unix"
)

// rawEpollLoop is rawLoop as an event loop: one goroutine, locked to its thread, keeps n
// connections busy (non-blocking sockets, one epoll instance), writing the next request on a
// connection as soon as its response has arrived, until total have completed. After work it
// polls without blocking for up to spin before it sleeps.
func rawEpollLoop(tb testing.TB, addr string, n, total int, spin time.Duration) (time.Duration, Histogram) {
	ap := netip.MustParseAddrPort(addr)
	sa := &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		tb.Fatal(err)
	}
	defer unix.Close(ep)
	type rc struct {
		fd  int
		got int
		t0  int64
	}
	conns := make(map[int32]*rc, n)
	defer func() {
		for fd := range conns {
			unix.Close(int(fd))
		}
	}()
	for range n {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			tb.Fatal(err)
		}
		if err := unix.Connect(fd, sa); err != nil {
			unix.Close(fd)
			tb.Fatal(err)
		}
		unix.SetNonblock(fd, true)
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		conns[int32(fd)] = &rc{fd: fd}
		unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
	}
	req := []byte("GET /x HTTP/1.1\r\nHost: bench\r\n\r\n")
	var h histogram
	buf := make([]byte, 4096)
	events := make([]unix.EpollEvent, 256)
	done, started := 0, 0
	start := time.Now()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for _, c := range conns {
		if started == total {
			break
		}
		started++
		c.t0 = monoNow()
		if _, err := unix.Write(c.fd, req); err != nil {
			tb.Fatal(err)
		}
	}
	active := monoNow()
	for done < total {
		timeout := -1
		if monoNow()-active < int64(spin) {
			timeout = 0
		}
		k, err := unix.EpollWait(ep, events, timeout)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			tb.Fatal(err)
		}
		if k == 0 {
			continue
		}
		active = monoNow()
		for _, ev := range events[:k] {
			c := conns[ev.Fd]
			m, err := unix.Read(c.fd, buf)
			if err == unix.EAGAIN {
				continue
			}
			if err != nil || m == 0 {
				tb.Fatalf("read: %v", err)
			}
			c.got += m
			if c.got < len(rawResponse) {
				continue
			}
			c.got -= len(rawResponse)
			now := monoNow()
			h.record(time.Duration(now - c.t0))
			done++
			if started < total {
				started++
				c.t0 = now
				if _, err := unix.Write(c.fd, req); err != nil {
					tb.Fatal(err)
				}
			}
		}
	}
	return time.Since(start), h.snapshot()
}

// BenchmarkLoop compares goroutine-per-connection and event-loop designs, on both sides, at
// 16, 64 and 256 in flight (2 ms service). Clients: "raw" (a goroutine and a connection per
// in-flight request, no HTTP), "rawloop" (one locked goroutine on epoll, no HTTP), and the
// endpoint with transport "h1" and "loop" (fixed limit). Servers: "goroutine" (rawServer) and
// "loop" (loopServer). LOOKUP_LOOP_SPIN sets the busy-poll of every loop (default 50µs).
func BenchmarkLoop(b *testing.B) {
	const service = 2 * time.Millisecond
	spin := h1.DefaultSpin
	if d, err := time.ParseDuration(os.Getenv("LOOKUP_LOOP_SPIN")); err == nil {
		spin = d
	}
	for _, inflight := range []int{16, 64, 256} {
		for _, srv := range []string{"goroutine", "loop"} {
			for _, cl := range []string{"raw", "rawloop", "h1", "loop"} {
				b.Run("inflight="+strconv.Itoa(inflight)+"/server="+srv+"/client="+cl, func(b *testing.B) {
					var s benchServer
					var addr string
					if srv == "loop" {
						ls := newLoopServer(b, service, spin)
						s, addr = ls, ls.addr
					} else {
						rs := newRawServer(b, service, 0)
						s, addr = rs, rs.ln.Addr().String()
					}
					var e *Endpoint
					if cl == "h1" || cl == "loop" {
						e = open(b, benchRegistry(b), "bench", benchConfigT(s.url(), inflight, "fixed", cl))
						if l, ok := e.async.(*h1.Loop); ok {
							l.Spin = spin
						}
					}
					run := func(total int) (time.Duration, Histogram) {
						switch cl {
						case "rawloop":
							return rawEpollLoop(b, addr, inflight, total, spin)
						case "raw":
							return rawLoop(b, addr, inflight, total)
						}
						return closedLoop(b, e, inflight, total)
					}
					run(10 * inflight)
					s.meanService()
					total := max(b.N, 4*inflight)
					cpu := startCPU()
					b.ResetTimer()
					el, h := run(total)
					b.StopTimer()
					reportThroughput(b, float64(total)/el.Seconds(), inflight, s.meanService(), h)
					cpu.report(b, total)
				})
			}
		}
	}
}
