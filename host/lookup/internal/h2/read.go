package h2

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/attempt"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// headerBlock is the header block being read (HEADERS and its CONTINUATIONs), decoded as
// it arrives: the fields go straight into the response, with no intermediate frame.
type headerBlock struct {
	open, endStream bool
	id              uint32
	room            int // header list bytes left before MaxResponseHeaderBytes
	status          string
	pseudoErr       string // a malformed or unexpected pseudo-header field
	regular         bool   // a regular field was seen (pseudo-fields must come first)
	fields          []hpack.HeaderField
	truncated       bool
}

// readLoop dials, runs the handshake, and then reads frames until the connection fails.
func (c *conn) readLoop() {
	defer c.t.wg.Done()
	br, err := c.handshake()
	if err != nil {
		c.fail(err)
		return
	}
	fr := http2.NewFramer(nil, br)
	fr.SetReuseFrames()
	fr.SetMaxReadFrameSize(maxFrameRead)
	c.hdec = hpack.NewDecoder(4096, c.onField)
	c.canon = make(map[string]string)
	c.hdec.SetMaxStringLength(c.t.MaxResponseHeaderBytes)
	batch := false
	for {
		if !wholeFrameBuffered(br) {
			// The next read may wait: write what this batch queued first.
			if batch {
				c.mu.Lock()
				c.inBatch = false
				c.unlock()
				batch = false
			}
		} else if !batch {
			c.mu.Lock()
			c.inBatch = true
			c.mu.Unlock()
			batch = true
		}
		if batch {
			c.mu.Lock()
			if c.unsent >= batchFlush {
				// A long batch: send the requests its completions made so far, so that
				// the first of them do not wait for the last response to be handled.
				c.inBatch = false
				c.unlock()
				c.mu.Lock()
				c.inBatch = true
			}
			c.mu.Unlock()
		}
		f, err := fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) && !c.hb.open {
				c.streamFailed(se.StreamID, &StreamError{Code: se.Code, Reason: "malformed response: " + se.Error()}, true)
				continue
			}
			c.fail(&connError{op: "read", err: err})
			return
		}
		if err := c.handle(f); err != nil {
			c.mu.Lock()
			if c.err == nil {
				c.fr.WriteGoAway(0, http2.ErrCodeProtocol, nil)
				c.inBatch = false // written now, before the connection closes
			}
			c.unlock()
			c.fail(&connError{op: "read", err: err})
			return
		}
	}
}

// stampReader is the reader's socket: it notes when each read returned. The buffer reads
// from the socket only when the frame being read is incomplete, so the frame being handled
// arrived with the last read.
type stampReader struct {
	r  io.Reader
	at time.Time
}

func (s *stampReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.at = time.Now()
	return n, err
}

// wholeFrameBuffered reports whether br holds a whole frame, so that reading it will not
// wait on the network.
func wholeFrameBuffered(br *bufio.Reader) bool {
	n := br.Buffered()
	if n < 9 {
		return false
	}
	h, _ := br.Peek(9)
	return n >= 9+int(h[0])<<16|int(h[1])<<8|int(h[2])
}

// handshake dials and exchanges the connection prefaces (RFC 9113 §3.4): the client
// preface, SETTINGS and a connection WINDOW_UPDATE out, the server's SETTINGS in.
func (c *conn) handshake() (*bufio.Reader, error) {
	ctx := c.t.Context
	c.mu.Lock()
	var deadline time.Time
	for _, st := range c.queued {
		if !st.deadline.IsZero() && (deadline.IsZero() || st.deadline.Before(deadline)) {
			deadline = st.deadline
		}
	}
	c.mu.Unlock()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	nc, err := c.t.Dial(ctx, "tcp", c.addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		nc.Close()
		return nil, c.err
	}
	c.nc = nc
	c.mu.Unlock()
	if !deadline.IsZero() {
		nc.SetDeadline(deadline)
	}
	var hs outBuf
	hs.b = append(hs.b, http2.ClientPreface...)
	wf := http2.NewFramer(&hs, nil)
	wf.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: maxFrameRead},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: uint32(c.t.MaxResponseHeaderBytes)},
	)
	wf.WriteWindowUpdate(0, connWindow-65535)
	if _, err := nc.Write(hs.b); err != nil {
		return nil, &connError{op: "write preface", err: err}
	}
	c.rd.r = nc
	br := bufio.NewReaderSize(&c.rd, readBufSize)
	rf := http2.NewFramer(nil, br)
	f, err := rf.ReadFrame()
	if err != nil {
		return nil, &connError{op: "read server preface", err: err}
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		return nil, &connError{op: "read server preface", err: errors.New("first frame is not SETTINGS (not an HTTP/2 server?)")}
	}
	nc.SetDeadline(time.Time{})
	rc := rawConn(nc)
	c.mu.Lock()
	defer c.unlock()
	if c.err != nil {
		return nil, c.err
	}
	c.rc = rc
	c.fr = http2.NewFramer(&c.out, nil)
	if err := c.applySettingsLocked(sf); err != nil {
		return nil, err
	}
	c.fr.WriteSettingsAck()
	c.ready = true
	c.startQueuedLocked()
	if len(c.queued) > 0 {
		// More streams than the server allows on one connection: the rest go to others.
		excess := c.queued
		c.queued = nil
		c.load -= len(excess)
		for _, st := range excess {
			c.unwatchLocked(st)
			st.c.Store(nil)
		}
		go func() {
			for _, st := range excess {
				c.t.requeue(st)
			}
		}()
	}
	return br, nil
}

func (c *conn) applySettingsLocked(sf *http2.SettingsFrame) error {
	return sf.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingMaxConcurrentStreams:
			c.maxStreams = int(max(1, min(s.Val, uint32(c.t.MaxStreamsPerConn)))) // 0 would strand queued streams
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerWindow
			c.peerWindow = int64(s.Val)
			for _, st := range c.streams {
				st.sendWin += delta
			}
		case http2.SettingMaxFrameSize:
			c.peerFrame = int(s.Val)
		case http2.SettingHeaderTableSize:
			c.henc.SetMaxDynamicTableSizeLimit(s.Val)
		}
		return nil
	})
}

// handle processes one frame on the reader goroutine. An error is a connection error.
func (c *conn) handle(f http2.Frame) error {
	if _, ok := f.(*http2.ContinuationFrame); c.hb.open && !ok {
		return errors.New("frame inside a header block")
	}
	switch f := f.(type) {
	case *http2.HeadersFrame:
		if c.hb.open {
			return errors.New("HEADERS inside a header block")
		}
		c.hb = headerBlock{open: true, id: f.StreamID, endStream: f.StreamEnded(), room: c.t.MaxResponseHeaderBytes, fields: c.hb.fields[:0]}
		return c.headerFragment(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.ContinuationFrame:
		if !c.hb.open || f.StreamID != c.hb.id {
			return errors.New("unexpected CONTINUATION")
		}
		return c.headerFragment(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.RSTStreamFrame:
		err := error(&StreamError{Code: f.ErrCode})
		if f.ErrCode == http2.ErrCodeRefusedStream {
			err = ErrRefused
		}
		c.streamFailed(f.StreamID, err, false)
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		c.mu.Lock()
		err := c.applySettingsLocked(f)
		if err == nil {
			c.fr.WriteSettingsAck()
			c.unblockLocked()
			c.startQueuedLocked()
		}
		c.unlock()
		return err
	case *http2.PingFrame:
		if !f.IsAck() {
			c.mu.Lock()
			c.fr.WritePing(true, f.Data)
			c.unlock()
		}
	case *http2.WindowUpdateFrame:
		c.mu.Lock()
		if f.StreamID == 0 {
			c.sendWin += int64(f.Increment)
			if c.sendWin > 1<<31-1 {
				c.unlock()
				return errors.New("connection flow-control window overflow")
			}
		} else if st := c.streams[f.StreamID]; st != nil {
			st.sendWin += int64(f.Increment)
		}
		c.unblockLocked()
		c.unlock()
	case *http2.GoAwayFrame:
		c.onGoAway(f)
	case *http2.PushPromiseFrame:
		return errors.New("PUSH_PROMISE received with push disabled")
	}
	return nil
}

func (c *conn) lookup(id uint32) *stream {
	c.mu.Lock()
	st := c.streams[id]
	if st != nil && st.ended {
		st = nil
	}
	c.mu.Unlock()
	return st
}

// headerFragment decodes a fragment of the open header block, and takes the block once it
// ends. A decoding error is a connection error: the HPACK state is lost (RFC 9113 §4.3).
func (c *conn) headerFragment(frag []byte, end bool) error {
	hb := &c.hb
	if len(frag) > 2*hb.room+64 {
		hb.truncated = true // far beyond the limit: stop decoding (the table still must be)
	}
	if _, err := c.hdec.Write(frag); err != nil {
		return fmt.Errorf("HPACK: %w", err)
	}
	if !end {
		return nil
	}
	if err := c.hdec.Close(); err != nil {
		return fmt.Errorf("HPACK: %w", err)
	}
	hb.open = false
	err := c.onHeaders(hb)
	clear(hb.fields)
	hb.fields = hb.fields[:0]
	return err
}

// onField is the HPACK decoder's emit function: it sorts a field into c.hb.
func (c *conn) onField(f hpack.HeaderField) {
	hb := &c.hb
	hb.room -= int(f.Size())
	if hb.room < 0 || hb.truncated {
		hb.truncated = true
		return
	}
	if f.IsPseudo() {
		switch {
		case hb.regular:
			hb.pseudoErr = "pseudo-header field after a regular one"
		case f.Name == ":status" && hb.status == "":
			hb.status = f.Value
		default:
			hb.pseudoErr = "unexpected pseudo-header field " + f.Name
		}
		return
	}
	hb.regular = true
	hb.fields = append(hb.fields, f)
}

// onHeaders takes a decoded header block: a response head (1xx heads are skipped) or
// trailers.
func (c *conn) onHeaders(hb *headerBlock) error {
	id := hb.id
	st := c.lookup(id)
	if st == nil {
		if id >= c.peekNextID() {
			return fmt.Errorf("HEADERS on idle stream %d", id)
		}
		return nil // a stream we reset
	}
	if hb.truncated {
		c.streamFailed(id, &StreamError{Code: http2.ErrCodeCancel, Reason: "response header list exceeds " + strconv.Itoa(c.t.MaxResponseHeaderBytes) + " bytes"}, true)
		return nil
	}
	if st.gotHead { // trailers
		if !hb.endStream || hb.status != "" || hb.pseudoErr != "" {
			c.streamFailed(id, &StreamError{Code: http2.ErrCodeProtocol, Reason: "malformed trailers"}, true)
			return nil
		}
		for _, hf := range hb.fields {
			if st.resp.Trailer == nil {
				st.resp.Trailer = http.Header{}
			}
			st.resp.Trailer.Add(hf.Name, hf.Value)
		}
		c.complete(st)
		return nil
	}
	if hb.pseudoErr != "" {
		c.streamFailed(id, &StreamError{Code: http2.ErrCodeProtocol, Reason: hb.pseudoErr}, true)
		return nil
	}
	status, err := strconv.Atoi(hb.status)
	if err != nil || status < 100 || status > 999 {
		c.streamFailed(id, &StreamError{Code: http2.ErrCodeProtocol, Reason: "malformed :status"}, true)
		return nil
	}
	if status < 200 {
		if status == 101 || hb.endStream {
			c.streamFailed(id, &StreamError{Code: http2.ErrCodeProtocol, Reason: "unexpected " + strconv.Itoa(status) + " response"}, true)
		}
		return nil // interim response: the final one follows
	}
	// When the bytes of this HEADERS frame came off the socket, not now: the frames read
	// before it in the same buffer, and their completions, are the client's time.
	st.a.MarkAnswered(c.rd.at)
	var h http.Header
	var vals []string
	keep := c.t.HeadersFor == nil || c.t.HeadersFor(status)
	if keep {
		h = make(http.Header, len(hb.fields))
		vals = make([]string, len(hb.fields)) // one backing array for the common one value per name
	}
	cl := int64(-1)
	for i, hf := range hb.fields {
		if !validFieldName(hf.Name) {
			c.streamFailed(id, &StreamError{Code: http2.ErrCodeProtocol, Reason: "invalid header field name"}, true)
			return nil
		}
		if hf.Name == "content-length" {
			n, err := strconv.ParseInt(hf.Value, 10, 64)
			if err != nil || n < 0 || (cl >= 0 && n != cl) {
				c.streamFailed(id, &StreamError{Code: http2.ErrCodeProtocol, Reason: "malformed content-length"}, true)
				return nil
			}
			cl = n
		}
		if !keep {
			continue
		}
		k, ok := c.canon[hf.Name]
		if !ok {
			k = http.CanonicalHeaderKey(hf.Name)
			if len(c.canon) < 256 {
				c.canon[hf.Name] = k
			}
		}
		if vs, ok := h[k]; ok {
			h[k] = append(vs, hf.Value)
		} else {
			vals[i] = hf.Value
			h[k] = vals[i : i+1 : i+1]
		}
	}
	if max := c.t.MaxBodyBytes; max > 0 && cl > max {
		c.streamFailed(id, attempt.ErrBodyTooLarge, true)
		return nil
	}
	st.gotHead = true
	st.resp = &http.Response{
		Status: statusLine(status), StatusCode: status,
		Proto: "HTTP/2.0", ProtoMajor: 2, Header: h, ContentLength: cl, Request: st.req,
	}
	if cl > 0 {
		st.rbody = make([]byte, 0, cl)
	}
	if hb.endStream {
		c.complete(st)
	}
	return nil
}

// validFieldName: a lower-case token (RFC 9113 §8.2.1: upper case is malformed).
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b >= 'A' && b <= 'Z' || b <= ' ' || b >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", b) >= 0 {
			return false
		}
	}
	return true
}

func (c *conn) peekNextID() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nextID
}

// onData takes a DATA frame: flow control first (even for streams that ended), then the
// body, bounded by MaxBodyBytes.
func (c *conn) onData(f *http2.DataFrame) error {
	n := int64(f.Length)
	c.mu.Lock()
	c.connUsed += n
	if c.connUsed >= connWindow/2 {
		c.fr.WriteWindowUpdate(0, uint32(c.connUsed))
		c.connUsed = 0
	}
	st := c.streams[f.StreamID]
	if st != nil && st.ended {
		st = nil
	}
	if st != nil && !f.StreamEnded() {
		st.recvUsed += n
		if st.recvUsed >= streamWindow/2 {
			c.fr.WriteWindowUpdate(st.id, uint32(st.recvUsed))
			st.recvUsed = 0
		}
	}
	c.unlock()
	if st == nil {
		return nil // a stream we reset: its data still counted against the windows above
	}
	if !st.gotHead {
		c.streamFailed(f.StreamID, &StreamError{Code: http2.ErrCodeProtocol, Reason: "DATA before the response head"}, true)
		return nil
	}
	data := f.Data()
	if max := c.t.MaxBodyBytes; max > 0 && int64(len(st.rbody)+len(data)) > max {
		c.streamFailed(f.StreamID, attempt.ErrBodyTooLarge, true)
		return nil
	}
	st.rbody = append(st.rbody, data...)
	if f.StreamEnded() {
		if cl := st.resp.ContentLength; cl >= 0 && int64(len(st.rbody)) != cl {
			c.streamFailed(f.StreamID, &StreamError{Code: http2.ErrCodeProtocol, Reason: "body length differs from content-length"}, true)
			return nil
		}
		c.complete(st)
	}
	return nil
}

// complete ends st with its response.
func (c *conn) complete(st *stream) {
	c.mu.Lock()
	if st.ended {
		c.mu.Unlock()
		return
	}
	if len(st.body) > 0 {
		// The server answered before the whole request body was sent: stop sending it.
		c.fr.WriteRSTStream(st.id, http2.ErrCodeNo)
	}
	c.endLocked(st)
	c.unlock()
	resp := st.resp
	if resp.ContentLength < 0 {
		resp.ContentLength = int64(len(st.rbody))
	}
	resp.Body = &body{b: st.rbody}
	st.finish(resp, nil)
}

// streamFailed ends stream id with err; reset says whether to send RST_STREAM.
func (c *conn) streamFailed(id uint32, err error, reset bool) {
	c.mu.Lock()
	st := c.streams[id]
	if st == nil || st.ended {
		c.mu.Unlock()
		return
	}
	if reset && c.err == nil {
		c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
	}
	c.endLocked(st)
	c.unlock()
	st.finish(nil, err)
}

// onGoAway stops new streams on c and fails those the server did not process.
func (c *conn) onGoAway(f *http2.GoAwayFrame) {
	c.mu.Lock()
	c.goingAway = true
	var refused []*stream
	for id, st := range c.streams {
		if id > f.LastStreamID && !st.ended {
			refused = append(refused, st)
		}
	}
	queued := c.queued // never sent: they move to another connection
	c.queued = nil
	for _, st := range queued {
		c.unwatchLocked(st)
		st.c.Store(nil)
	}
	c.load -= len(queued)
	c.mu.Unlock()
	c.t.retire(c)
	for _, st := range refused {
		c.streamFailed(st.id, ErrRefused, false)
	}
	for _, st := range queued {
		c.t.requeue(st)
	}
	c.mu.Lock()
	if len(c.streams) == 0 && c.err == nil {
		c.err = errors.New("h2: connection closed after GOAWAY")
		c.closeLocked()
	}
	c.mu.Unlock()
}
