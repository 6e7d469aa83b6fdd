package uring

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Dialer dials TCP connections whose connect, reads and writes are operations on a Reactor. Its
// DialContext fits http.Transport.DialContext. Experimental, like the rest of the package, and
// not faster: on loopback an http.Client over it ran at 0.4-0.8 of the standard transport's
// request rate with one request in flight and 0.5-1.3 with 16 (BenchmarkHTTPClient; DESIGN.md), because
// every read and write is a round trip through the reactor, where Go's network poller parks
// the goroutine and retries the system call in place.
type Dialer struct {
	// Reactor runs the operations. Required.
	Reactor *Reactor

	// Resolver resolves host names. Nil means net.DefaultResolver.
	Resolver *net.Resolver

	// Control, if not nil, is called with each resolved address ("ip:port") before the
	// connection attempt; an error skips the address. Egress policy belongs here: it sees the
	// address actually dialled, after name resolution.
	Control func(network, address string) error
}

// DialContext connects to address ("host:port") on network "tcp", "tcp4" or "tcp6", trying the
// resolved addresses in order. ctx bounds resolution and connection, not the connection's life.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	opErr := func(err error) error { return &net.OpError{Op: "dial", Net: network, Err: err} }
	var ipNet string
	switch network {
	case "tcp":
		ipNet = "ip"
	case "tcp4":
		ipNet = "ip4"
	case "tcp6":
		ipNet = "ip6"
	default:
		return nil, opErr(net.UnknownNetworkError(network))
	}
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return nil, opErr(err)
	}
	res := d.Resolver
	if res == nil {
		res = net.DefaultResolver
	}
	port, err := res.LookupPort(ctx, network, portStr)
	if err != nil {
		return nil, opErr(err)
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else if ips, err = res.LookupNetIP(ctx, ipNet, host); err != nil {
		return nil, opErr(err)
	}

	var firstErr error
	for _, ip := range ips {
		ip = ip.Unmap()
		if (ipNet == "ip4" && !ip.Is4()) || (ipNet == "ip6" && !ip.Is6()) {
			continue
		}
		ap := netip.AddrPortFrom(ip, uint16(port))
		c, err := d.dial(ctx, network, ap)
		if err == nil {
			return c, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	if firstErr == nil {
		firstErr = &net.AddrError{Err: "no suitable address", Addr: host}
	}
	return nil, opErr(firstErr)
}

func (d *Dialer) dial(ctx context.Context, network string, ap netip.AddrPort) (net.Conn, error) {
	if d.Control != nil {
		if err := d.Control(network, ap.String()); err != nil {
			return nil, err
		}
	}
	family := unix.AF_INET6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	if ap.Addr().Is4() {
		family = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	// Non-blocking: io_uring does not need it (it polls internally), but the pool backend's
	// workers can then wait in poll(2) and notice Close and deadlines.
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	// Go's net package sets TCP_NODELAY on every TCP connection; match it so the comparison
	// with the standard transport is fair.
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	if _, err := d.Reactor.Do(ctx, Connect(fd, sa)); err != nil {
		unix.Close(fd)
		return nil, err
	}
	c := &conn{fd: fd, r: d.Reactor, raddr: net.TCPAddrFromAddrPort(ap)}
	if lsa, err := unix.Getsockname(fd); err == nil {
		c.laddr = tcpAddr(lsa)
	}
	c.idle = sync.NewCond(&c.mu)
	return c, nil
}

func tcpAddr(sa unix.Sockaddr) *net.TCPAddr {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: sa.Addr[:], Port: sa.Port}
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: sa.Addr[:], Port: sa.Port, Zone: zoneName(sa.ZoneId)}
	}
	return nil
}

func zoneName(id uint32) string {
	if id == 0 {
		return ""
	}
	if ifi, err := net.InterfaceByIndex(int(id)); err == nil {
		return ifi.Name
	}
	return strconv.Itoa(int(id))
}

// conn is a TCP connection driven through a Reactor.
//
// Close cancels the operations in flight and closes the descriptor only once they have
// completed: io_uring holds its own reference to the file, so closing the descriptor would
// neither stop a pending read nor free the buffer it writes into.
type conn struct {
	fd           int
	r            *Reactor
	laddr, raddr *net.TCPAddr

	mu     sync.Mutex
	closed bool
	active [2]map[*opState]*pending // operations in flight per direction
	dl     [2]time.Time             // read and write deadlines; zero means none
	idle   *sync.Cond               // on mu: an operation left active
}

// pending is an operation of a conn's, from just before it is submitted until its result is
// back.
//
// INVARIANT: nothing cancels an operation before the engine has accepted it (submitted), since
// the engine has nothing to cancel yet: a cancellation then would be lost, and the operation
// would run without a deadline, or keep Close waiting for a read that nothing ends. So
// deadline timers are armed, and Close cancels, only once submitted is true; do itself cancels
// right after submission if Close came first, and arms the timer with the deadline current at
// that point.
type pending struct {
	submitted bool
	timer     *time.Timer // deadline timer, armed once submitted; nil when there is no deadline
}

const (
	dirRead = iota
	dirWrite
)

var dirNames = [2]string{"read", "write"}

// do runs op in direction dir and waits for it.
func (c *conn) do(dir int, op Op) (int, error) {
	ch := make(chan Result, 1)
	o, err := newOpState(op, func(res Result) { ch <- res })
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, net.ErrClosed
	}
	dl := c.dl[dir]
	if !dl.IsZero() && !time.Now().Before(dl) {
		c.mu.Unlock()
		return 0, os.ErrDeadlineExceeded
	}
	if c.active[dir] == nil {
		c.active[dir] = make(map[*opState]*pending)
	}
	p := &pending{}
	c.active[dir][o] = p
	c.mu.Unlock()

	err = c.r.e.submit(o)
	c.mu.Lock()
	if err == nil {
		p.submitted = true
		if c.closed {
			c.r.e.cancel(o) // Close ran meanwhile and could not cancel o itself
		} else {
			p.timer = c.armLocked(o, c.dl[dir]) // the deadline may have moved meanwhile
		}
	}
	c.mu.Unlock()
	res := Result{Err: err}
	if err == nil {
		res = <-ch
	}

	c.mu.Lock()
	if p.timer != nil {
		p.timer.Stop()
	}
	delete(c.active[dir], o)
	timedOut := !c.dl[dir].IsZero() && !time.Now().Before(c.dl[dir])
	closed := c.closed
	c.idle.Broadcast()
	c.mu.Unlock()

	if errors.Is(res.Err, syscall.ECANCELED) || errors.Is(res.Err, ErrClosed) {
		switch {
		case closed:
			res.Err = net.ErrClosed
		case timedOut:
			res.Err = os.ErrDeadlineExceeded
		}
	}
	return res.N, res.Err
}

// armLocked starts a timer cancelling o at deadline dl, if there is one.
func (c *conn) armLocked(o *opState, dl time.Time) *time.Timer {
	if dl.IsZero() {
		return nil
	}
	return time.AfterFunc(time.Until(dl), func() { c.r.e.cancel(o) })
}

func (c *conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	n, err := c.do(dirRead, Read(c.fd, b, -1))
	if err != nil {
		return n, c.opError(dirRead, err)
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

func (c *conn) Write(b []byte) (int, error) {
	written := 0
	for written < len(b) {
		n, err := c.do(dirWrite, Write(c.fd, b[written:], -1))
		written += n
		if err != nil {
			return written, c.opError(dirWrite, err)
		}
	}
	return written, nil
}

func (c *conn) opError(dir int, err error) error {
	if err == io.EOF {
		return err
	}
	return &net.OpError{Op: dirNames[dir], Net: "tcp", Source: c.laddr, Addr: c.raddr, Err: err}
}

func (c *conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return &net.OpError{Op: "close", Net: "tcp", Source: c.laddr, Addr: c.raddr, Err: net.ErrClosed}
	}
	c.closed = true
	for dir := range c.active {
		for o, p := range c.active[dir] {
			if p.submitted { // do cancels the others once they are (see pending)
				c.r.e.cancel(o) // lock order: conn.mu before the engine's
			}
		}
	}
	for len(c.active[dirRead])+len(c.active[dirWrite]) > 0 {
		c.idle.Wait()
	}
	c.mu.Unlock()
	return unix.Close(c.fd)
}

func (c *conn) LocalAddr() net.Addr  { return c.laddr }
func (c *conn) RemoteAddr() net.Addr { return c.raddr }

func (c *conn) SetDeadline(t time.Time) error {
	c.setDeadline(dirRead, t)
	c.setDeadline(dirWrite, t)
	return nil
}
func (c *conn) SetReadDeadline(t time.Time) error  { c.setDeadline(dirRead, t); return nil }
func (c *conn) SetWriteDeadline(t time.Time) error { c.setDeadline(dirWrite, t); return nil }

// setDeadline also applies to operations already pending, as net.Conn requires: their timers
// are replaced.
func (c *conn) setDeadline(dir int, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dl[dir] = t
	for o, p := range c.active[dir] {
		if !p.submitted {
			continue // do arms it with c.dl once it is (see pending)
		}
		if p.timer != nil {
			p.timer.Stop()
		}
		p.timer = c.armLocked(o, t)
	}
}
