//go:build linux

package h1

import (
	"context"
	"errors"
	"math"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/deadline"
	"golang.org/x/sys/unix"
)

// LoopAvailable reports whether Loop works on this platform.
const LoopAvailable = true

// Loop is an event-loop HTTP/1.1 client: the seed engine's HttpPool design. One goroutine,
// locked to its OS thread, owns every pooled keep-alive connection (non-blocking sockets,
// one epoll instance): it writes requests, reads responses, parses them with the
// transport's own parser, and calls each exchange's done callback. There is no goroutine
// per request or per connection; a dial runs on a goroutine of its own, through Dial (the
// egress guard), after which the loop takes the socket over.
//
// The point is wake-up latency, not CPU: with a goroutine per connection on Go's netpoller,
// the time from a peer's write until the reader runs grows with the number of connections
// (host/lookup's DESIGN.md, BenchmarkHops). The loop reads every ready connection in one
// pass, and after a pass with work it polls epoll without blocking for up to Spin before it
// sleeps, so that a busy loop does not pay an idle vCPU's wake-up per event. The spin is
// bounded in time, and only happens while events come faster than Spin (the last sleep was
// shorter): a lightly loaded loop sleeps in epoll_wait at once.
//
// done runs on the loop goroutine: it must not block, and should hand heavy work elsewhere.
// It may call Start. Set the fields before the first Start; the methods are safe for
// concurrent use.
type Loop struct {
	// Dial opens a connection; it must return a socket (a net.Conn with a file descriptor).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Context, if set, bounds every dial (cancelled: dials fail).
	Context context.Context
	// Limits, as on Transport.
	MaxIdleConnsPerHost    int
	IdleConnTimeout        time.Duration
	MaxResponseHeaderBytes int
	MaxHeaderCount         int
	MaxBodyBytes           int64
	// Spin is how long the loop keeps polling without blocking after its last work. Zero:
	// DefaultSpin; negative: never.
	Spin time.Duration

	once    sync.Once
	initErr error
	t       Transport // the limits, defaulted; also what parses responses
	ep, efd int
	spin    int64
	epoch   time.Time // deadlines and the spin are measured from here, on the monotonic clock
	done    chan struct{}

	npost  atomic.Int32 // posts not yet taken by the loop: lets the loop skip the lock
	closed atomic.Bool  // mu.closed, for the loop's spin
	mu     struct {
		sync.Mutex
		start    []*loopExch
		cancel   []*loopExch
		dialed   []dialed
		closed   bool
		sleeping bool // the loop is in (or about to enter) a blocking epoll_wait
	}

	// Owned by the loop goroutine.
	conns  map[int32]*lconn
	idle   map[string][]*lconn
	active map[*loopExch]struct{}
	timers deadline.Heap[*loopExch]
	p      parser
	rbuf   []byte // scratch for reads on idle connections
}

// DefaultSpin is the loop's default busy-poll after work.
const DefaultSpin = 50 * time.Microsecond

// loopExch is one exchange on a Loop.
type loopExch struct {
	l          *Loop
	a          *Attempt
	req        *http.Request
	addr       string
	wbuf       []byte
	written    int
	replayable bool
	probe      bool
	replayed   bool
	deadline   int64 // ns since l.epoch (monotonic); 0: none
	done       func(*http.Response, error)
	c          *lconn
	hidx       int // index in the deadline heap, -1 if not in it
	finished   bool
}

// lconn is one connection of a Loop.
type lconn struct {
	fd      int
	addr    string
	buf     []byte // bytes received of the current response
	n       int
	fr      framer // when the bytes received are worth parsing
	lx      *loopExch
	idleAt  time.Time
	reused  bool
	out     bool // EPOLLOUT armed
	gotByte bool // a byte of the current response arrived
}

type dialed struct {
	lx  *loopExch
	fd  int
	err error
}

func (l *Loop) init() {
	l.once.Do(func() {
		l.t = Transport{
			MaxIdleConnsPerHost: l.MaxIdleConnsPerHost, IdleConnTimeout: l.IdleConnTimeout,
			MaxResponseHeaderBytes: l.MaxResponseHeaderBytes, MaxHeaderCount: l.MaxHeaderCount,
			MaxBodyBytes: l.MaxBodyBytes,
		}
		l.t.init()
		l.p.t = &l.t
		l.epoch = time.Now()
		switch {
		case l.Spin == 0:
			l.spin = int64(DefaultSpin)
		case l.Spin > 0:
			l.spin = int64(l.Spin)
		}
		var err error
		if l.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
			l.initErr = os.NewSyscallError("epoll_create1", err)
			return
		}
		if l.efd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
			unix.Close(l.ep)
			l.initErr = os.NewSyscallError("eventfd", err)
			return
		}
		unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, l.efd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(l.efd)})
		l.conns = make(map[int32]*lconn)
		l.idle = make(map[string][]*lconn)
		l.active = make(map[*loopExch]struct{})
		l.rbuf = make([]byte, 512)
		l.done = make(chan struct{})
		go l.run()
	})
}

// Handles reports whether Start serves req (the same requests as Transport.Handles).
func (l *Loop) Handles(req *http.Request) bool { return l.t.Handles(req) }

// Start sends req and calls done with the response (its body read in full, at most
// MaxBodyBytes) or an error, from the loop goroutine, or from a new goroutine if the loop
// is closed or the request is refused before anything is sent; never before Start returns
// on the calling goroutine. a carries the deadline and cancellation (a.Cancel aborts the
// exchange) and Wrote; it must not be reused before done has been called.
func (l *Loop) Start(req *http.Request, a *Attempt, done func(*http.Response, error)) {
	l.init()
	fail := func(err error) { go done(nil, err) }
	if l.initErr != nil {
		closeBody(req)
		fail(l.initErr)
		return
	}
	if !l.t.Handles(req) {
		closeBody(req)
		fail(ErrUnsupported)
		return
	}
	b := make([]byte, 0, 256+max(req.ContentLength, 0))
	b, _, err := appendRequest(b, req, math.MaxInt64) // the whole body: sent from memory
	if err != nil {
		fail(err)
		return
	}
	lx := &loopExch{
		l: l, a: a, req: req, addr: l.t.addr(req.URL), wbuf: b, done: done, hidx: -1,
		replayable: idempotent(req),
	}
	lx.probe = !lx.replayable
	if !a.Deadline.IsZero() {
		lx.deadline = max(1, int64(a.Deadline.Sub(l.epoch)))
	}
	a.mu.Lock()
	if a.cancelled {
		a.mu.Unlock()
		fail(&opError{op: "write request", err: context.Canceled})
		return
	}
	a.lx = lx
	a.mu.Unlock()
	if !l.post(func() { l.mu.start = append(l.mu.start, lx) }) {
		a.mu.Lock()
		a.lx = nil
		a.mu.Unlock()
		fail(&opError{op: "write request", err: ErrClosed})
	}
}

// cancel asks the loop to abort lx (from Attempt.Cancel).
func (l *Loop) cancel(lx *loopExch) {
	l.post(func() { l.mu.cancel = append(l.mu.cancel, lx) })
}

// post runs add under the lock and wakes the loop if it sleeps. It reports false once the
// loop is closed (add is not run).
func (l *Loop) post(add func()) bool {
	l.mu.Lock()
	if l.mu.closed {
		l.mu.Unlock()
		return false
	}
	add()
	l.npost.Add(1)
	wake := l.mu.sleeping
	l.mu.sleeping = false
	l.mu.Unlock()
	if wake {
		var one = [8]byte{1}
		unix.Write(l.efd, one[:])
	}
	return true
}

// Close aborts every exchange (they fail with ErrClosed), closes the connections and stops
// the loop. Start after Close fails with ErrClosed.
func (l *Loop) Close() {
	l.init()
	if l.initErr != nil {
		return
	}
	l.mu.Lock()
	already := l.mu.closed
	l.mu.closed = true
	l.closed.Store(true)
	l.mu.Unlock()
	if !already {
		var one = [8]byte{1}
		unix.Write(l.efd, one[:])
	}
	<-l.done
}

// now is the loop's clock: ns since l.epoch, monotonic.
func (l *Loop) now() int64 { return int64(time.Since(l.epoch)) }

func (l *Loop) run() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(l.done)
	events := make([]unix.EpollEvent, 256)
	var start, cancel []*loopExch
	var dials []dialed
	active := l.now()
	spinning := false // the last sleep was shorter than the spin
	for {
		closed := false
		if l.npost.Load() > 0 {
			l.mu.Lock()
			start, l.mu.start = l.mu.start, start[:0]
			cancel, l.mu.cancel = l.mu.cancel, cancel[:0]
			dials, l.mu.dialed = l.mu.dialed, dials[:0]
			l.npost.Store(0)
			closed = l.mu.closed
			l.mu.Unlock()
			for _, d := range dials {
				l.onDialed(d)
			}
			for _, lx := range start {
				l.begin(lx)
			}
			for _, lx := range cancel {
				if !lx.finished {
					l.fail(lx, "read response", context.Canceled, false, false)
				}
			}
			clear(start)
			clear(cancel)
			clear(dials)
			active = l.now()
		} else {
			closed = l.closed.Load()
		}
		if closed {
			l.shutdown()
			return
		}
		now := l.now()
		l.expire(now)
		// Poll without blocking while the last work is less than spin ago, if the last sleep
		// was shorter than that too (events come faster than the spin: a light load sleeps at
		// once and burns nothing); else sleep until the next deadline (or a post).
		timeout := 0
		if !spinning || now-active >= l.spin {
			timeout = -1
			if l.timers.Len() > 0 {
				timeout = int(max(0, (l.timers.Min().deadline-now+int64(time.Millisecond)-1)/int64(time.Millisecond)))
			}
			l.mu.Lock()
			if l.npost.Load() > 0 || l.mu.closed {
				timeout = 0
			} else {
				l.mu.sleeping = true
			}
			l.mu.Unlock()
		}
		n, err := unix.EpollWait(l.ep, events, timeout)
		if timeout != 0 {
			l.mu.Lock()
			l.mu.sleeping = false
			l.mu.Unlock()
			spinning = l.now()-now < l.spin
		}
		if err != nil && err != unix.EINTR {
			panic("h1: loop: epoll_wait: " + err.Error())
		}
		if n > 0 {
			active = l.now()
		}
		for _, ev := range events[:max(n, 0)] {
			if int(ev.Fd) == l.efd {
				var b [8]byte
				unix.Read(l.efd, b[:])
				continue
			}
			c := l.conns[ev.Fd]
			if c == nil {
				continue
			}
			if ev.Events&unix.EPOLLOUT != 0 && c.lx != nil {
				l.write(c.lx)
			}
			if ev.Events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 && l.conns[ev.Fd] == c {
				l.read(c)
			}
		}
	}
}

// begin starts lx: on an idle connection, or on a new one.
func (l *Loop) begin(lx *loopExch) {
	l.active[lx] = struct{}{}
	if lx.deadline != 0 {
		l.timers.Push(lx)
	}
	if c := l.idleConn(lx.addr, lx.probe); c != nil {
		l.attach(lx, c)
		return
	}
	l.dial(lx)
}

// idleConn takes the most recently used idle connection for addr, after aging out the old
// ones; probe checks it with a non-blocking peek first.
func (l *Loop) idleConn(addr string, probe bool) *lconn {
	cs := l.idle[addr]
	now := time.Now()
	k := 0
	for k < len(cs) && now.Sub(cs[k].idleAt) > l.t.IdleConnTimeout {
		l.closeConn(cs[k])
		k++
	}
	if k > 0 {
		cs = append(cs[:0], cs[k:]...)
	}
	for len(cs) > 0 {
		c := cs[len(cs)-1]
		cs[len(cs)-1] = nil
		cs = cs[:len(cs)-1]
		if (probe || now.Sub(c.idleAt) > probeIdle) && !peekAlive(c.fd) {
			l.closeConn(c)
			continue
		}
		l.idle[addr] = cs
		c.reused = true
		return c
	}
	l.idle[addr] = cs
	return nil
}

func peekAlive(fd int) bool {
	var b [1]byte
	_, _, err := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	return err == unix.EAGAIN
}

// dial opens a connection for lx on a goroutine of its own (the egress guard may resolve
// names and blocks), then hands its socket to the loop.
func (l *Loop) dial(lx *loopExch) {
	a := lx.a
	ctx := l.Context
	if ctx == nil {
		ctx = context.Background()
	}
	var cancel context.CancelFunc
	if lx.deadline == 0 {
		ctx, cancel = context.WithCancel(ctx)
	} else {
		ctx, cancel = context.WithDeadline(ctx, lx.a.Deadline)
	}
	a.mu.Lock()
	a.dialCancel = cancel
	a.mu.Unlock()
	go func() {
		defer cancel()
		nc, err := l.Dial(ctx, "tcp", lx.addr)
		a.mu.Lock()
		a.dialCancel = nil
		a.mu.Unlock()
		fd := -1
		if err == nil {
			fd, err = takeOver(nc)
		}
		if !l.post(func() { l.mu.dialed = append(l.mu.dialed, dialed{lx: lx, fd: fd, err: err}) }) && fd >= 0 {
			unix.Close(fd) // the loop closed; it has failed lx already
		}
	}()
}

// takeOver moves a dialled socket out of Go's netpoller: a duplicate descriptor, made
// non-blocking, that the loop owns; the original is closed (which does not close the socket).
func takeOver(nc net.Conn) (int, error) {
	defer nc.Close()
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return -1, errors.New("h1: loop: the dialled connection is not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, os.NewSyscallError("fcntl", derr)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, os.NewSyscallError("fcntl", err)
	}
	return fd, nil
}

func (l *Loop) onDialed(d dialed) {
	lx := d.lx
	if lx.finished {
		if d.fd >= 0 {
			unix.Close(d.fd)
		}
		return
	}
	if d.err != nil {
		l.complete(lx, nil, lx.a.wrap("dial", d.err, false))
		return
	}
	c := &lconn{fd: d.fd, addr: lx.addr, buf: make([]byte, readBufSize)}
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, d.fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(d.fd)}); err != nil {
		unix.Close(d.fd)
		l.complete(lx, nil, lx.a.wrap("dial", os.NewSyscallError("epoll_ctl", err), false))
		return
	}
	l.conns[int32(d.fd)] = c
	l.attach(lx, c)
}

// attach gives c to lx and writes the request.
func (l *Loop) attach(lx *loopExch, c *lconn) {
	lx.c, c.lx = c, lx
	c.n, c.fr, c.gotByte = 0, framer{}, false
	lx.written = 0
	lx.a.wrote.Store(true) // from here on the request may reach the network
	l.write(lx)
}

func (l *Loop) write(lx *loopExch) {
	c := lx.c
	for lx.written < len(lx.wbuf) {
		n, err := unix.Write(c.fd, lx.wbuf[lx.written:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			if !c.out {
				c.out = true
				unix.EpollCtl(l.ep, unix.EPOLL_CTL_MOD, c.fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLOUT, Fd: int32(c.fd)})
			}
			return
		}
		if err != nil {
			l.fail(lx, "write request", err, c.reused && lx.written == 0, lx.written == 0)
			return
		}
		lx.written += n
	}
	if c.out {
		c.out = false
		unix.EpollCtl(l.ep, unix.EPOLL_CTL_MOD, c.fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(c.fd)})
	}
}

// readCap bounds what a connection buffers for one response.
func (l *Loop) readCap() int {
	body := l.t.MaxBodyBytes
	if body <= 0 || body > 1<<30 {
		body = 1 << 30
	}
	return l.t.MaxResponseHeaderBytes + int(body) + 2*maxChunkOverhead + readBufSize
}

func (l *Loop) read(c *lconn) {
	lx := c.lx
	if lx == nil {
		// An idle connection has nothing to say: the peer closed it, or misbehaves.
		for {
			_, err := unix.Read(c.fd, l.rbuf)
			if err == unix.EINTR {
				continue
			}
			if err != unix.EAGAIN {
				l.removeIdle(c)
				l.closeConn(c)
			}
			return
		}
	}
	if c.n == len(c.buf) {
		if len(c.buf) >= l.readCap() {
			l.fail(lx, "read response", ErrBodyTooLarge, false, false)
			return
		}
		c.buf = append(c.buf, make([]byte, len(c.buf))...)[:min(2*len(c.buf), l.readCap())]
	}
	n, err := unix.Read(c.fd, c.buf[c.n:])
	eof := false
	switch {
	case err == unix.EAGAIN || err == unix.EINTR:
		return
	case err != nil:
		stale := c.reused && !c.gotByte && (err == unix.ECONNRESET || err == unix.EPIPE)
		l.fail(lx, "read response", err, stale, false)
		return
	case n == 0:
		eof = true
	default:
		c.n += n
		c.gotByte = true
	}
	// Parse only where the response can end (framer): the parse starts from the first
	// byte. A buffer at its bound is parsed too: for the parser's own error if there is one.
	full := c.n == len(c.buf) && len(c.buf) >= l.readCap()
	if !eof && !full && !c.fr.ready(c.buf[:c.n], l.t.MaxResponseHeaderBytes) {
		return
	}
	r, perr := l.p.parse(c.buf[:c.n], eof, lx.req)
	if errors.Is(perr, errMore) {
		if full {
			l.fail(lx, "read response", ErrBodyTooLarge, false, false)
			return
		}
		c.fr.more(c.n, r)
		return
	}
	if perr != nil {
		stale := c.reused && r.nothingRead && (perr == errServerClosed)
		l.fail(lx, "read response", perr, stale, false)
		return
	}
	// Done: pool the connection if the response was framed exactly (and came after the
	// whole request: a server that answers early may still be reading it).
	c.lx, lx.c = nil, nil
	if r.reusable && lx.written == len(lx.wbuf) && !eof {
		l.pool(c)
	} else {
		l.closeConn(c)
	}
	l.complete(lx, r.resp, nil)
}

func (l *Loop) pool(c *lconn) {
	cs := l.idle[c.addr]
	if len(cs) >= l.t.MaxIdleConnsPerHost {
		l.closeConn(c)
		return
	}
	c.idleAt = time.Now()
	c.reused = false
	if cap(c.buf) > 4*readBufSize {
		c.buf = make([]byte, readBufSize)
	}
	l.idle[c.addr] = append(cs, c)
}

func (l *Loop) removeIdle(c *lconn) {
	cs := l.idle[c.addr]
	for i, x := range cs {
		if x == c {
			l.idle[c.addr] = append(cs[:i], cs[i+1:]...)
			return
		}
	}
}

func (l *Loop) closeConn(c *lconn) {
	if c.fd < 0 {
		return
	}
	delete(l.conns, int32(c.fd))
	unix.Close(c.fd) // also removes it from the epoll set
	c.fd = -1
}

// fail ends lx after an error on its connection (closed). stale: the failure came on a
// reused connection before any response byte, so the peer most likely closed it while idle;
// the request is then replayed once on a new connection if that is safe (idempotent, or
// nothing was written).
func (l *Loop) fail(lx *loopExch, op string, err error, stale, nothingWritten bool) {
	if c := lx.c; c != nil {
		lx.c, c.lx = nil, nil
		l.closeConn(c)
	}
	if stale && !lx.replayed && (lx.replayable || nothingWritten) && !lx.a.isCancelled() {
		lx.replayed = true
		lx.probe = false
		l.dial(lx) // a fresh connection: never an idle one that may be as stale
		return
	}
	l.complete(lx, nil, lx.a.wrap(op, err, false))
}

// complete delivers lx's outcome, once.
func (l *Loop) complete(lx *loopExch, resp *http.Response, err error) {
	if lx.finished {
		return
	}
	lx.finished = true
	delete(l.active, lx)
	l.timers.Remove(lx)
	a := lx.a
	a.mu.Lock()
	if a.lx == lx {
		a.lx = nil
	}
	a.mu.Unlock()
	lx.done(resp, err)
}

// expire fails the exchanges whose deadline has passed.
func (l *Loop) expire(now int64) {
	for l.timers.Len() > 0 && l.timers.Min().deadline <= now {
		l.fail(l.timers.Pop(), "read response", os.ErrDeadlineExceeded, false, false)
	}
}

// shutdown fails everything in flight with ErrClosed and closes every connection.
func (l *Loop) shutdown() {
	l.mu.Lock()
	start, dials := l.mu.start, l.mu.dialed
	l.mu.start, l.mu.cancel, l.mu.dialed = nil, nil, nil
	l.mu.Unlock()
	for _, d := range dials {
		if d.fd >= 0 {
			unix.Close(d.fd)
		}
	}
	for lx := range l.active {
		start = append(start, lx)
	}
	for _, lx := range start {
		if c := lx.c; c != nil {
			lx.c, c.lx = nil, nil
			l.closeConn(c)
		}
		a := lx.a
		a.mu.Lock()
		if a.dialCancel != nil {
			a.dialCancel()
		}
		a.mu.Unlock()
		l.complete(lx, nil, a.wrap("read response", ErrClosed, true))
	}
	for _, c := range l.conns {
		unix.Close(c.fd)
	}
	clear(l.conns)
	clear(l.idle)
	unix.Close(l.efd)
	unix.Close(l.ep)
}

// The deadline heap's view of an exchange.
func (lx *loopExch) Before(o *loopExch) bool { return lx.deadline < o.deadline }
func (lx *loopExch) SetIndex(i int)          { lx.hidx = i }
func (lx *loopExch) Index() int              { return lx.hidx }
