package lookup

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Server is the HTTP/2 counterpart of rawServer: a minimal cleartext HTTP/2 server ("prior
// knowledge" h2c, no Upgrade) on 127.0.0.1 for benchmarks. Per connection one goroutine reads
// frames and one writes them; there is no goroutine per stream. The reader discards request
// bodies (returning their flow-control credit), and when a stream's request is complete it
// appends (stream, time read, time due) to a FIFO: the service time is constant, so due
// times are in order. The writer sleeps on a timer until the head is due, then encodes every
// due response (HEADERS ":status 200", then DATA "ok" with END_STREAM) and the pending control
// frames (SETTINGS ACK, PING ACK, WINDOW_UPDATE) into one buffer and writes it with one
// conn.Write: under load a few syscalls carry many responses. That is all the HTTP/2 a
// client of this benchmark needs, at a fraction of the CPU per request of net/http's HTTP/2
// server (about 4x rawServer's), so the benchmark measures the client, not the upstream. Like
// rawServer it measures the service time it actually delivered (from the request read to its
// response written; timers overshoot, more so under load), which is what the Little's-law
// bound is computed from.
type h2Server struct {
	ln        net.Listener
	service   int64 // ns
	epoch     time.Time
	monoEpoch int64 // CLOCK_MONOTONIC at epoch, ns
	served    atomic.Int64
	svcNanos  atomic.Int64
	wg        sync.WaitGroup
	mu        sync.Mutex
	conns     map[*h2Conn]bool
	closed    bool
}

const (
	h2MaxStreams     = 1000
	h2StreamWindow   = 1 << 20  // advertised SETTINGS_INITIAL_WINDOW_SIZE (stream receive window)
	h2ConnWindow     = 16 << 20 // connection receive window after the opening WINDOW_UPDATE
	h2DefaultWindow  = 65535    // initial windows before any SETTINGS or WINDOW_UPDATE
	h2MaxWindow      = 1<<31 - 1
	h2MaxFrame       = 16384 // SETTINGS_MAX_FRAME_SIZE: the default, for both directions
	h2HeaderTableMax = 4096
)

// h2Body is the response body; h2Server's responses (a few bytes of header block and these
// two bytes of DATA) are far below the 16 KiB minimum SETTINGS_MAX_FRAME_SIZE a peer may
// set, so no response frame ever needs splitting.
var h2Body = []byte("ok")

func newH2Server(tb testing.TB, service time.Duration) *h2Server {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &h2Server{ln: ln, service: int64(service), epoch: time.Now(), conns: map[*h2Conn]bool{}}
	s.monoEpoch = monotonicNow() - int64(time.Since(s.epoch))
	s.wg.Add(1)
	go s.accept()
	tb.Cleanup(s.close)
	return s
}

func (s *h2Server) url() string { return "http://" + s.ln.Addr().String() }

// now is the monotonic time since the server started, in ns.
func (s *h2Server) now() int64 { return int64(time.Since(s.epoch)) }

// meanService returns the mean service time delivered since the last call.
func (s *h2Server) meanService() time.Duration {
	n := s.served.Swap(0)
	ns := s.svcNanos.Swap(0)
	if n == 0 {
		return 0
	}
	return time.Duration(ns / n)
}

func (s *h2Server) accept() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			return
		}
		c := newH2Conn(s, nc)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return
		}
		s.conns[c] = true
		s.wg.Add(2)
		s.mu.Unlock()
		go c.readLoop()
		go c.writeLoop()
	}
}

// close stops accepting, sends every connection a GOAWAY, closes it, and waits for the
// goroutines.
func (s *h2Server) close() {
	s.ln.Close()
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.nc.SetWriteDeadline(time.Now().Add(time.Second)) // a writer stuck on a peer that does not read
		c.stop()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// h2Stream is the state of one open stream.
type h2Stream struct {
	window  int64  // send window
	unacked uint32 // request body bytes received and not yet returned by a WINDOW_UPDATE
	state   uint8
}

const (
	h2Open    uint8 = iota // request body still arriving
	h2Queued               // request complete, response in the FIFO
	h2Blocked              // HEADERS sent, DATA waiting for send window
)

// h2Due is one request waiting for its response.
type h2Due struct {
	id        uint32
	read, due int64 // h2Server.now() when the request was complete, and when its response is due
}

// h2Ring is a FIFO of h2Due that reuses its storage.
type h2Ring struct {
	buf     []h2Due // len a power of two
	head, n int
}

func (r *h2Ring) push(d h2Due) {
	if r.n == len(r.buf) {
		nb := make([]h2Due, max(256, 2*len(r.buf)))
		for i := range r.n {
			nb[i] = r.buf[(r.head+i)&(len(r.buf)-1)]
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = d
	r.n++
}

func (r *h2Ring) peek() h2Due { return r.buf[r.head] }

func (r *h2Ring) pop() {
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
}

// h2Out is one piece of response the writer encodes.
type h2Out struct {
	h2Due
	kind uint8
}

const (
	h2Full    uint8 = iota // HEADERS and DATA
	h2Headers              // HEADERS only: the DATA waits for send window
	h2Data                 // DATA only, of an earlier h2Headers
)

// h2Conn is one connection of h2Server. The reader only records: it updates the state under
// mu, queues requests, and writes control frames into ctrl; the writer is the only one to
// write to the connection.
type h2Conn struct {
	s        *h2Server
	nc       net.Conn
	tf       *wakeTimer    // the writer's timer (see armLocked)
	armed    int64         // when tf fires, in h2Server.now() ns; 0: disarmed; guarded by mu
	done     chan struct{} // closed by stop
	stopOnce sync.Once

	mu           sync.Mutex
	ctrl         bytes.Buffer  // control frames for the writer to send
	cfr          *http2.Framer // writes into ctrl
	streams      map[uint32]h2Stream
	due          h2Ring
	blocked      []h2Due // HEADERS sent, DATA waiting for send window; in order
	sendConn     int64   // connection send window
	peerInit     int64   // peer's SETTINGS_INITIAL_WINDOW_SIZE
	peerTable    uint32  // peer's SETTINGS_HEADER_TABLE_SIZE, when tableChanged
	tableChanged bool
	connCredit   uint32 // request body bytes received and not yet returned on stream 0
	lastID       uint32
	goaway       bool // the peer sent GOAWAY: no new streams

	// The writer's own.
	out   bytes.Buffer
	wfr   *http2.Framer // writes into out
	hbuf  bytes.Buffer
	henc  *hpack.Encoder
	batch []h2Out
}

func newH2Conn(s *h2Server, nc net.Conn) *h2Conn {
	c := &h2Conn{
		s:        s,
		nc:       nc,
		done:     make(chan struct{}),
		streams:  make(map[uint32]h2Stream, 256),
		sendConn: h2DefaultWindow,
		peerInit: h2DefaultWindow,
	}
	c.cfr = http2.NewFramer(&c.ctrl, nil)
	c.wfr = http2.NewFramer(&c.out, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.out.Grow(64 << 10)
	// The server preface, sent by the writer's first wake-up.
	c.cfr.WriteSettings(
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: h2MaxStreams},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2StreamWindow},
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: h2MaxFrame},
	)
	c.cfr.WriteWindowUpdate(0, h2ConnWindow-h2DefaultWindow)
	c.tf = newWakeTimer()
	c.signal()
	return c
}

// signal wakes the writer now.
func (c *h2Conn) signal() {
	c.mu.Lock()
	c.armLocked(c.s.now())
	c.mu.Unlock()
}

// armLocked makes the writer's timerfd fire at at (h2Server.now() ns) unless it fires
// sooner. A timerfd, not a time.Timer: an idle Go runtime sleeps in epoll_wait, whose
// timeout is in whole milliseconds, so its timers fire up to 1 ms late; a timerfd is a
// file the same epoll_wait watches, and the kernel wakes it on time. An upstream whose
// responses left on 1 ms ticks would hand the client bursts no real service produces.
func (c *h2Conn) armLocked(at int64) {
	if c.armed != 0 && c.armed <= at {
		return
	}
	c.armed = at
	c.tf.arm(c.s.monoEpoch + max(at, 1))
}

func (c *h2Conn) stop() { c.stopOnce.Do(func() { close(c.done) }) }

// enqueue queues stream id's response, read at now; it reports whether the writer must be
// woken (the FIFO was empty, so its timer is not set for an earlier head). Called with mu.
func (c *h2Conn) enqueue(id uint32, now int64) bool {
	wasEmpty := c.due.n == 0
	c.due.push(h2Due{id: id, read: now, due: now + c.s.service})
	return wasEmpty
}

func (c *h2Conn) readLoop() {
	defer c.s.wg.Done()
	defer c.stop()
	br := bufio.NewReaderSize(c.nc, 64<<10)
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(br, preface[:]); err != nil || string(preface[:]) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(nil, br)
	fr.ReadMetaHeaders = hpack.NewDecoder(h2HeaderTableMax, nil)
	fr.SetReuseFrames()
	fr.SetMaxReadFrameSize(h2MaxFrame)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		wake := false
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			id := f.StreamID
			if id == 0 || id%2 == 0 {
				return // not a client stream: PROTOCOL_ERROR
			}
			end := f.StreamEnded()
			var now int64
			if end {
				now = c.s.now()
			}
			c.mu.Lock()
			if st, ok := c.streams[id]; ok {
				// Trailers.
				if st.state == h2Open && end {
					st.state = h2Queued
					c.streams[id] = st
					wake = c.enqueue(id, now)
				}
			} else if id > c.lastID && !c.goaway {
				c.lastID = id
				st := h2Stream{window: c.peerInit, state: h2Open}
				if end {
					st.state = h2Queued
					wake = c.enqueue(id, now)
				}
				c.streams[id] = st
			}
			c.mu.Unlock()

		case *http2.DataFrame:
			id := f.StreamID
			n := f.Header().Length // padding included: it counts against the window
			end := f.StreamEnded()
			var now int64
			if end {
				now = c.s.now()
			}
			c.mu.Lock()
			// Return the credit in batches, well before the peer could run out: on the
			// connection when a quarter of its window is used (or with the next write), on
			// the stream when a quarter of its window is.
			c.connCredit += n
			wake = c.connCredit >= h2ConnWindow/4
			if st, ok := c.streams[id]; ok && st.state == h2Open {
				if end {
					st.state = h2Queued
					wake = c.enqueue(id, now) || wake
				} else if st.unacked += n; st.unacked >= h2StreamWindow/4 {
					c.cfr.WriteWindowUpdate(id, st.unacked)
					st.unacked = 0
					wake = true
				}
				c.streams[id] = st
			}
			c.mu.Unlock()

		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			c.mu.Lock()
			for i := range f.NumSettings() {
				set := f.Setting(i)
				if set.Valid() != nil {
					c.mu.Unlock()
					return
				}
				switch set.ID {
				case http2.SettingInitialWindowSize:
					delta := int64(set.Val) - c.peerInit
					c.peerInit = int64(set.Val)
					for id, st := range c.streams {
						st.window += delta
						c.streams[id] = st
					}
				case http2.SettingHeaderTableSize:
					c.peerTable, c.tableChanged = set.Val, true
				}
				// SETTINGS_MAX_FRAME_SIZE needs nothing: see h2Body.
			}
			c.cfr.WriteSettingsAck()
			c.mu.Unlock()
			wake = true

		case *http2.PingFrame:
			if f.IsAck() {
				continue
			}
			c.mu.Lock()
			c.cfr.WritePing(true, f.Data)
			c.mu.Unlock()
			wake = true

		case *http2.WindowUpdateFrame:
			inc := int64(f.Increment)
			c.mu.Lock()
			if f.StreamID == 0 {
				c.sendConn += inc
				if inc == 0 || c.sendConn > h2MaxWindow {
					c.mu.Unlock()
					return // PROTOCOL_ERROR, FLOW_CONTROL_ERROR
				}
			} else if st, ok := c.streams[f.StreamID]; ok {
				if st.window += inc; st.window > h2MaxWindow {
					c.cfr.WriteRSTStream(f.StreamID, http2.ErrCodeFlowControl)
					delete(c.streams, f.StreamID)
				} else {
					c.streams[f.StreamID] = st
				}
			}
			wake = len(c.blocked) > 0 || c.ctrl.Len() > 0
			c.mu.Unlock()

		case *http2.RSTStreamFrame:
			c.mu.Lock()
			delete(c.streams, f.StreamID) // the writer drops whatever it still has of it
			c.mu.Unlock()

		case *http2.GoAwayFrame:
			c.mu.Lock()
			c.goaway = true
			c.mu.Unlock()
		}
		if wake {
			c.signal()
		}
	}
}

func (c *h2Conn) writeLoop() {
	defer c.s.wg.Done()
	defer func() {
		c.nc.Close()
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	}()
	go func() { <-c.done; c.tf.Close() }() // ends the read below
	for {
		if err := c.tf.wait(); err != nil {
			c.mu.Lock()
			last := c.lastID
			c.mu.Unlock()
			c.out.Reset()
			c.wfr.WriteGoAway(last, http2.ErrCodeNo, nil)
			c.nc.SetWriteDeadline(time.Now().Add(time.Second))
			c.nc.Write(c.out.Bytes())
			return
		}
		c.mu.Lock()
		c.armed = 0
		c.mu.Unlock()
		next, err := c.flush()
		if err != nil {
			return
		}
		if next >= 0 {
			c.mu.Lock()
			c.armLocked(next)
			c.mu.Unlock()
		}
	}
}

// flush writes, in one conn.Write, the pending control frames and every response that is
// due and has send window. It returns when the next response is due (-1: none queued).
func (c *h2Conn) flush() (next int64, err error) {
	now := c.s.now()
	c.batch = c.batch[:0]
	c.mu.Lock()
	if c.ctrl.Len() > 0 {
		c.out.Write(c.ctrl.Bytes())
		c.ctrl.Reset()
	}
	if c.connCredit > 0 {
		c.wfr.WriteWindowUpdate(0, c.connCredit)
		c.connCredit = 0
	}
	if c.tableChanged {
		c.henc.SetMaxDynamicTableSizeLimit(c.peerTable)
		c.tableChanged = false
	}
	// DATA held for send window, in order.
	kept := c.blocked[:0]
	for _, d := range c.blocked {
		st, ok := c.streams[d.id]
		if !ok {
			continue // reset
		}
		if len(kept) == 0 && c.sendConn >= int64(len(h2Body)) && st.window >= int64(len(h2Body)) {
			c.sendConn -= int64(len(h2Body))
			delete(c.streams, d.id)
			c.batch = append(c.batch, h2Out{d, h2Data})
		} else {
			kept = append(kept, d)
		}
	}
	c.blocked = kept
	for c.due.n > 0 {
		d := c.due.peek()
		if d.due > now {
			break
		}
		c.due.pop()
		st, ok := c.streams[d.id]
		if !ok {
			continue // reset
		}
		if len(c.blocked) == 0 && c.sendConn >= int64(len(h2Body)) && st.window >= int64(len(h2Body)) {
			c.sendConn -= int64(len(h2Body))
			delete(c.streams, d.id)
			c.batch = append(c.batch, h2Out{d, h2Full})
		} else {
			st.state = h2Blocked
			c.streams[d.id] = st
			c.blocked = append(c.blocked, d)
			c.batch = append(c.batch, h2Out{d, h2Headers})
		}
	}
	next = -1
	if c.due.n > 0 {
		next = c.due.peek().due
	}
	c.mu.Unlock()

	var served, readSum int64
	for _, o := range c.batch {
		if o.kind != h2Data {
			c.hbuf.Reset()
			c.henc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
			c.henc.WriteField(hpack.HeaderField{Name: "content-type", Value: "text/plain"})
			c.henc.WriteField(hpack.HeaderField{Name: "content-length", Value: "2"})
			c.wfr.WriteHeaders(http2.HeadersFrameParam{StreamID: o.id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
		}
		if o.kind != h2Headers {
			c.wfr.WriteData(o.id, true, h2Body)
			served++
			readSum += o.read
		}
	}
	if c.out.Len() == 0 {
		return next, nil
	}
	if served > 0 {
		c.s.svcNanos.Add(served*c.s.now() - readSum)
		c.s.served.Add(served)
	}
	_, err = c.nc.Write(c.out.Bytes())
	c.out.Reset()
	return next, err
}
