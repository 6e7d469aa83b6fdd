package lookup

import (
	"bytes"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// loopServer is rawServer as an event loop: one goroutine, locked to its thread, owns the
// listener and every connection (non-blocking sockets, one epoll instance). A request read in
// full is answered after the service time from a FIFO of due responses (the service time is
// the same for all, so the FIFO is in due order), woken by a timerfd. After a round of work it
// polls epoll without blocking for up to spin before it sleeps, so that a busy server does not
// pay a vCPU's wake-up for every event. It measures the service time it delivered as rawServer
// does: from the request read to the response written.
type loopServer struct {
	addr     string
	lfd, ep  int
	tfd, efd int // timerfd for due responses, eventfd to stop
	service  time.Duration
	spin     time.Duration
	served   atomic.Int64
	svcNanos atomic.Int64
	done     chan struct{}
}

type lsConn struct {
	fd  int
	buf []byte
	n   int
}

type lsDue struct {
	c          *lsConn
	read, due  int64 // monotonic ns
	closeAfter bool
}

func init() {
	childUpstreams["loop"] = func(tb testing.TB, service time.Duration) benchServer {
		return newLoopServer(tb, service, 50*time.Microsecond)
	}
}

func newLoopServer(tb testing.TB, service, spin time.Duration) *loopServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	f, err := ln.(*net.TCPListener).File() // a blocking dup; made non-blocking below
	ln.Close()
	if err != nil {
		tb.Fatal(err)
	}
	lfd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		tb.Fatal(err)
	}
	s := &loopServer{addr: ln.Addr().String(), lfd: lfd, service: service, spin: spin, done: make(chan struct{})}
	must := func(err error) {
		if err != nil {
			tb.Fatal(err)
		}
	}
	must(unix.SetNonblock(lfd, true))
	s.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	must(err)
	s.tfd, err = unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	must(err)
	s.efd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	must(err)
	for _, fd := range []int{lfd, s.tfd, s.efd} {
		must(unix.EpollCtl(s.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}))
	}
	go s.run()
	tb.Cleanup(s.close)
	return s
}

func (s *loopServer) url() string { return "http://" + s.addr }

func (s *loopServer) meanService() time.Duration {
	n := s.served.Swap(0)
	ns := s.svcNanos.Swap(0)
	if n == 0 {
		return 0
	}
	return time.Duration(ns / n)
}

func (s *loopServer) close() {
	var one = [8]byte{1}
	unix.Write(s.efd, one[:])
	<-s.done
}

// monoNow is CLOCK_MONOTONIC in ns (the timerfd's clock), through the runtime's vDSO call
// (unix.ClockGettime is a real system call): the offset between it and time's monotonic
// reading is measured once.
func monoNow() int64 { return monoBase + int64(time.Since(monoEpoch)) }

var monoEpoch, monoBase = func() (time.Time, int64) {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Now(), ts.Nano()
}()

func (s *loopServer) run() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(s.done)
	conns := map[int32]*lsConn{}
	defer func() {
		for fd := range conns {
			unix.Close(int(fd))
		}
		unix.Close(s.lfd)
		unix.Close(s.tfd)
		unix.Close(s.efd)
		unix.Close(s.ep)
	}()
	var q []lsDue // FIFO of responses due, oldest first
	var armed, active int64
	events := make([]unix.EpollEvent, 256)
	var scratch [8]byte
	svc := int64(s.service)
	drop := func(c *lsConn) {
		unix.Close(c.fd)
		delete(conns, int32(c.fd))
		c.fd = -1
	}
	for {
		// Answer what is due.
		now := monoNow()
		k := 0
		var served, nanos int64
		for ; k < len(q) && q[k].due <= now; k++ {
			d := q[k]
			if d.c.fd < 0 {
				continue
			}
			served++
			nanos += now - d.read
			if _, err := unix.Write(d.c.fd, rawResponse); err != nil || d.closeAfter {
				drop(d.c) // a short write of 67 bytes to loopback does not happen here
			}
		}
		if served > 0 {
			s.served.Add(served)
			s.svcNanos.Add(nanos)
		}
		q = append(q[:0], q[k:]...)
		if served > 0 {
			active = now
		}
		// Wait: poll without blocking while the last work is less than spin ago or the next
		// response is due within spin (both bounded in time); else arm the timer for the next
		// response and block.
		timeout := -1
		if now-active < int64(s.spin) || len(q) > 0 && q[0].due-now <= int64(s.spin) {
			timeout = 0
		} else if len(q) > 0 {
			if armed != q[0].due {
				armed = q[0].due
				its := unix.ItimerSpec{Value: unix.NsecToTimespec(armed)}
				unix.TimerfdSettime(s.tfd, unix.TFD_TIMER_ABSTIME, &its, nil)
			}
		}
		n, err := s.wait(events, timeout)
		if err != nil {
			return
		}
		if n > 0 {
			active = monoNow()
		}
		for _, ev := range events[:n] {
			switch int(ev.Fd) {
			case s.efd:
				return
			case s.tfd:
				unix.Read(s.tfd, scratch[:])
				armed = 0
				continue
			case s.lfd:
				for range 64 {
					fd, _, err := unix.Accept4(s.lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
					if err != nil {
						break
					}
					unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
					c := &lsConn{fd: fd, buf: make([]byte, 4096)}
					conns[int32(fd)] = c
					unix.EpollCtl(s.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(fd)})
				}
				continue
			}
			c := conns[ev.Fd]
			if c == nil {
				continue
			}
			m, err := unix.Read(c.fd, c.buf[c.n:])
			if err == unix.EAGAIN {
				continue
			}
			if err != nil || m == 0 {
				drop(c)
				continue
			}
			c.n += m
			read := monoNow()
			// Every complete request in the buffer is queued.
			for {
				end := bytes.Index(c.buf[:c.n], []byte("\r\n\r\n"))
				if end < 0 {
					if c.n == len(c.buf) {
						drop(c) // head larger than the buffer: not needed here
					}
					break
				}
				length, closeAfter, ok := scanHead(c.buf[:end])
				total := end + 4 + int(length)
				if !ok || total > len(c.buf) {
					drop(c)
					break
				}
				if c.n < total {
					break
				}
				q = append(q, lsDue{c: c, read: read, due: read + svc, closeAfter: closeAfter})
				c.n = copy(c.buf, c.buf[total:c.n])
			}
		}
	}
}

// wait is epoll_wait, retried on EINTR.
func (s *loopServer) wait(events []unix.EpollEvent, timeout int) (int, error) {
	for {
		n, err := unix.EpollWait(s.ep, events, timeout)
		if err == unix.EINTR {
			continue
		}
		return n, err
	}
}

// scanHead reads Content-Length and Connection: close from a request head; a chunked body
// is not accepted.
func scanHead(h []byte) (length int64, closeAfter, ok bool) {
	for len(h) > 0 {
		var line []byte
		line, h, _ = bytes.Cut(h, []byte("\r\n"))
		name, value, found := bytes.Cut(line, []byte(":"))
		if !found {
			continue // the request line
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			n, err := strconv.ParseInt(string(value), 10, 64)
			if err != nil || n < 0 {
				return 0, false, false
			}
			length = n
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return 0, false, false
		case bytes.EqualFold(name, []byte("Connection")) && bytes.EqualFold(value, []byte("close")):
			closeAfter = true
		}
	}
	return length, closeAfter, true
}
