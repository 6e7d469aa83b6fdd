package h2

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/deadline"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// conn is one HTTP/2 connection.
type conn struct {
	t    *Transport
	addr string
	nc   net.Conn // set by the reader goroutine once dialled; guarded by mu until then

	mu sync.Mutex
	// Guarded by mu.
	err        error // the connection failed: no more streams
	ready      bool  // the server's SETTINGS arrived
	goingAway  bool
	streams    map[uint32]*stream
	queued     []*stream // waiting for the handshake or for a stream slot
	blocked    []*stream // sent, with body bytes waiting for flow-control credit
	load       int       // streams assigned: open and queued
	idle       *time.Timer
	nextID     uint32
	maxStreams int
	peerWindow int64 // the peer's initial stream window
	peerFrame  int
	sendWin    int64 // the peer's connection window
	connUsed   int64 // bytes received since the last connection WINDOW_UPDATE
	idleSince  time.Time
	out        outBuf // frames queued for the writer
	fr         *http2.Framer
	henc       *hpack.Encoder
	hbuf       []byte
	lower      map[string]string // canonical header name → lower case
	rc         syscall.RawConn   // nc's descriptor, for non-blocking writes; nil without one
	spare      []byte            // a write buffer to swap with out
	rest       []byte            // what a non-blocking write left, for the writer goroutine
	writing    bool              // a write is in progress
	handoff    bool              // the writer goroutine is the writer
	inBatch    bool              // the reader is handling frames it has buffered: it writes after
	unsent     int               // streams opened in out since the last write
	// sentWait: the streams whose HEADERS are in out, not yet handed to a write. They are
	// marked sent when a write takes them (stampSentLocked), not when they were queued: the
	// wait for a write in progress or for the reader's batch is the client's.
	sentWait []*stream
	wcond    sync.Cond // wakes the writer goroutine
	closed   chan struct{}

	deadlines deadline.Heap[*stream] // the assigned streams with a deadline; guarded by mu
	dtimer    *time.Timer            // fires at deadlines[0]; guarded by mu
	armed     time.Time              // when dtimer fires; zero when stopped; guarded by mu

	// Owned by the reader goroutine.
	rd    stampReader // the socket, as the reader's buffer reads it
	hdec  *hpack.Decoder
	hb    headerBlock
	canon map[string]string // response field name → canonical form
}

// outBuf is the writer's pending bytes; the framer appends to it.
type outBuf struct{ b []byte }

func (o *outBuf) Write(p []byte) (int, error) { o.b = append(o.b, p...); return len(p), nil }

// hblock is the HPACK encoder's sink.
type hblock struct{ c *conn }

func (h hblock) Write(p []byte) (int, error) { h.c.hbuf = append(h.c.hbuf, p...); return len(p), nil }

func (t *Transport) newConnLocked(addr string) *conn {
	c := &conn{
		t: t, addr: addr, streams: make(map[uint32]*stream), nextID: 1,
		maxStreams: t.MaxStreamsPerConn, peerWindow: 65535, peerFrame: 16384, sendWin: 65535,
		lower: make(map[string]string), closed: make(chan struct{}),
	}
	c.wcond.L = &c.mu
	c.henc = hpack.NewEncoder(hblock{c})
	t.wg.Add(2)
	go c.readLoop()
	go c.writeLoop()
	return c
}

// addLocked assigns st to c: it is sent now, or queued until the handshake or a free slot.
func (c *conn) addLocked(st *stream) {
	if !st.deadline.IsZero() && c.err == nil {
		c.watchLocked(st)
	}
	c.load++
	if c.err != nil {
		// Failed between pick and now: fail st from a new goroutine (no lock in done).
		c.load--
		err := c.err
		st.ended = true
		go st.finish(nil, err)
		return
	}
	if !c.ready || len(c.streams) >= c.maxStreams || c.goingAway {
		c.queued = append(c.queued, st)
		return
	}
	c.sendLocked(st)
}

// sendLocked opens st's stream: HEADERS, CONTINUATION, and as much of the body as the
// windows allow.
func (c *conn) sendLocked(st *stream) {
	req := st.req
	st.id = c.nextID
	c.nextID += 2
	c.unsent++
	c.streams[st.id] = st
	st.sendWin = c.peerWindow

	c.hbuf = c.hbuf[:0]
	path := req.URL.RequestURI()
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	c.field(":method", req.Method, false)
	c.field(":scheme", "http", false)
	c.field(":authority", host, false)
	// A path is seldom repeated: indexing it would only evict the fields that do repeat.
	c.hbuf = appendUnindexed(c.hbuf, staticPath, "", path)
	for k, vs := range req.Header {
		switch k {
		case "Host", "Connection", "Proxy-Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Te", "Content-Length":
			continue // connection-specific in HTTP/1.1: not sent over HTTP/2 (RFC 9113 §8.2.2)
		}
		name, ok := c.lower[k]
		if !ok {
			name = strings.ToLower(k)
			if len(c.lower) < 256 {
				c.lower[k] = name
			}
		}
		sensitive := k == "Authorization" || k == "Proxy-Authorization" || k == "Cookie" || c.t.Sensitive[k]
		for _, v := range vs {
			c.field(name, v, sensitive)
		}
	}
	if len(st.body) > 0 {
		c.field("content-length", strconv.Itoa(len(st.body)), false)
	}
	block := c.hbuf
	endStream := len(st.body) == 0
	first := true
	for first || len(block) > 0 {
		n := min(len(block), c.peerFrame)
		frag := block[:n]
		block = block[n:]
		if first {
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: frag, EndStream: endStream, EndHeaders: len(block) == 0})
			first = false
		} else {
			c.fr.WriteContinuation(st.id, len(block) == 0, frag)
		}
	}
	st.a.MarkWrote()
	// Queued for the next write, which follows at once unless one is in progress or the
	// reader is in a batch: the upstream's share of the exchange (attempt.Attempt.Upstream)
	// starts when that write takes it (stampSentLocked).
	c.sentWait = append(c.sentWait, st)
	if len(st.body) > 0 {
		c.sendBodyLocked(st)
	}
}

func (c *conn) field(name, value string, sensitive bool) {
	c.henc.WriteField(hpack.HeaderField{Name: name, Value: value, Sensitive: sensitive})
}

// staticPath is ":path"'s index in HPACK's static table (RFC 7541 appendix A).
const staticPath = 4

// appendUnindexed appends a "literal header field without indexing" (RFC 7541 §6.2.2):
// the field goes out as it is, and neither side adds it to its dynamic table. The name is
// the static table's entry nameIdx, or name if nameIdx is 0. hpack.Encoder has no such
// form for a field that is not sensitive, and it must not come first in a header block,
// where the encoder may put a table size update.
func appendUnindexed(dst []byte, nameIdx uint64, name, value string) []byte {
	dst = appendInt(dst, 4, 0, nameIdx)
	if nameIdx == 0 {
		dst = appendString(dst, name)
	}
	return appendString(dst, value)
}

// appendString appends an HPACK string literal, Huffman-coded when that is shorter.
func appendString(dst []byte, s string) []byte {
	if n := hpack.HuffmanEncodeLength(s); n < uint64(len(s)) {
		dst = appendInt(dst, 7, 0x80, n)
		return hpack.AppendHuffmanString(dst, s)
	}
	dst = appendInt(dst, 7, 0, uint64(len(s)))
	return append(dst, s...)
}

// appendInt appends i with an n-bit prefix (RFC 7541 §5.1) in a first byte whose other bits
// are flags.
func appendInt(dst []byte, n uint, flags byte, i uint64) []byte {
	k := uint64(1)<<n - 1
	if i < k {
		return append(dst, flags|byte(i))
	}
	dst = append(dst, flags|byte(k))
	for i -= k; i >= 128; i >>= 7 {
		dst = append(dst, byte(0x80|i&0x7f))
	}
	return append(dst, byte(i))
}

// sendBodyLocked sends what the windows allow of st's body; the rest waits in c.blocked.
// It reports whether the body is all sent.
func (c *conn) sendBodyLocked(st *stream) bool {
	for len(st.body) > 0 {
		n := int64(min(len(st.body), c.peerFrame))
		n = min(n, st.sendWin, c.sendWin)
		if n <= 0 {
			c.blocked = append(c.blocked, st)
			return false
		}
		chunk := st.body[:n]
		st.body = st.body[n:]
		st.sendWin -= n
		c.sendWin -= n
		c.fr.WriteData(st.id, len(st.body) == 0, chunk)
	}
	return true
}

// unblockLocked resumes bodies after the windows grew.
func (c *conn) unblockLocked() {
	if len(c.blocked) == 0 {
		return
	}
	b := c.blocked
	c.blocked = nil
	for i, st := range b {
		if st.ended {
			continue
		}
		if !c.sendBodyLocked(st) {
			// st went back into c.blocked; keep the others after it, in order.
			c.blocked = append(c.blocked, b[i+1:]...)
			break
		}
	}
}

// endLocked removes st from c (it ends now) and starts a queued stream in its slot.
func (c *conn) endLocked(st *stream) {
	st.ended = true
	c.unwatchLocked(st)
	c.load--
	if st.id != 0 {
		delete(c.streams, st.id)
	} else {
		for i, q := range c.queued {
			if q == st {
				c.queued = append(c.queued[:i], c.queued[i+1:]...)
				break
			}
		}
	}
	c.startQueuedLocked()
	if len(c.streams) == 0 && len(c.queued) == 0 {
		c.idleSince = time.Now()
		if c.goingAway && c.err == nil {
			c.err = errors.New("h2: connection drained after GOAWAY")
			c.closeLocked()
			return
		}
		if c.idle == nil {
			c.idle = time.AfterFunc(c.t.IdleConnTimeout, c.closeIfIdle)
		} else {
			c.idle.Reset(c.t.IdleConnTimeout)
		}
	}
}

// closeIfIdle closes c if it has had no stream for IdleConnTimeout.
func (c *conn) closeIfIdle() {
	c.mu.Lock()
	idle := c.err == nil && len(c.streams) == 0 && len(c.queued) == 0
	if idle {
		if left := c.t.IdleConnTimeout - time.Since(c.idleSince); left > 0 {
			c.idle.Reset(left)
			idle = false
		}
	}
	c.mu.Unlock()
	if idle {
		c.fail(&connError{op: "idle", err: errors.New("connection idle")})
	}
}

func (c *conn) startQueuedLocked() {
	for c.ready && c.err == nil && !c.goingAway && len(c.queued) > 0 && len(c.streams) < c.maxStreams {
		st := c.queued[0]
		c.queued = c.queued[1:]
		c.sendLocked(st)
	}
}

// closeLocked closes the socket and wakes the writer; the reader then fails.
func (c *conn) closeLocked() {
	select {
	case <-c.closed:
	default:
		close(c.closed)
		if c.nc != nil {
			c.nc.Close()
		}
	}
	c.wcond.Broadcast()
}

// fail ends c with err: every stream on it fails (with ErrRefused wrapped if the request
// was never sent), the socket is closed and c leaves the pool.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.closeLocked()
	if c.idle != nil {
		c.idle.Stop()
	}
	if c.dtimer != nil {
		c.dtimer.Stop()
	}
	c.deadlines.Clear()
	var ended []*stream
	for _, st := range c.streams {
		if !st.ended {
			st.ended = true
			ended = append(ended, st)
		}
	}
	for _, st := range c.queued {
		if !st.ended {
			st.ended = true
			ended = append(ended, st)
		}
	}
	c.streams = map[uint32]*stream{}
	c.queued = nil
	c.blocked = nil
	clear(c.sentWait)
	c.sentWait = c.sentWait[:0]
	c.load = 0
	c.mu.Unlock()
	c.t.retire(c)
	for _, st := range ended {
		e := err
		if st.id == 0 {
			e = &connError{op: "dial", err: err}
		}
		st.finish(nil, e)
	}
}

// Writing. Frames are appended to c.out under c.mu, and written by whoever releases c.mu
// next (unlock), with one non-blocking system call, unless a write is in progress (its
// writer then loops) or the reader is in a batch: the frames it reads back to back come
// out of one buffered read, and their completions queue frames that the reader writes
// together before it reads again. A write that would block (a full socket buffer), and
// every write on a connection without a file descriptor, is handed to the writer
// goroutine, which may block: Start's callers and the reader never do.

// unlock releases c.mu, writing the queued frames first (see above).
func (c *conn) unlock() {
	for !c.inBatch && !c.writing && len(c.out.b) > 0 && c.ready && c.err == nil {
		if c.rc == nil {
			c.handoffLocked(nil)
			break
		}
		c.writing = true
		b := c.out.b
		c.out.b = c.spare[:0]
		c.spare = nil
		c.unsent = 0
		c.stampSentLocked(time.Now())
		c.mu.Unlock()
		n, err := c.tryWrite(b)
		c.mu.Lock()
		c.writing = false
		if err != nil {
			c.mu.Unlock()
			c.fail(&connError{op: "write", err: err})
			return
		}
		if n < len(b) {
			c.handoffLocked(b[n:])
			break
		}
		if cap(b) <= maxKeptWrite {
			c.spare = b[:0]
		}
	}
	c.mu.Unlock()
}

// stampSentLocked marks the requests in the bytes a write is about to take sent at now (see
// sentWait). A stream aborted since its HEADERS were queued is skipped: its attempt may
// already serve the call's next exchange.
func (c *conn) stampSentLocked(now time.Time) {
	for i, st := range c.sentWait {
		if !st.ended {
			st.a.MarkSent(now)
		}
		c.sentWait[i] = nil
	}
	c.sentWait = c.sentWait[:0]
}

// handoffLocked makes the writer goroutine the writer: it sends rest, then c.out until
// it is empty.
func (c *conn) handoffLocked(rest []byte) {
	c.writing = true
	c.rest = rest
	c.handoff = true
	c.wcond.Signal()
}

// writeLoop is the writer goroutine (see unlock).
func (c *conn) writeLoop() {
	defer c.t.wg.Done()
	var spare []byte
	for {
		c.mu.Lock()
		for c.err == nil && !c.handoff {
			c.wcond.Wait()
		}
		if c.err != nil {
			c.mu.Unlock()
			return
		}
		b := c.rest
		c.rest = nil
		if len(b) == 0 {
			b = c.out.b
			c.out.b = spare[:0]
			spare = nil
			c.stampSentLocked(time.Now())
		}
		if len(b) == 0 {
			c.handoff, c.writing = false, false
			c.mu.Unlock()
			continue
		}
		nc := c.nc
		c.mu.Unlock()
		_, err := nc.Write(b)
		if err != nil {
			c.fail(&connError{op: "write", err: err})
			return
		}
		if spare == nil && cap(b) <= maxKeptWrite {
			spare = b[:0]
		}
	}
}
