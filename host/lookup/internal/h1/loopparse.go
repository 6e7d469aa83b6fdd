package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"time"
)

// errMore: the bytes received so far end inside the response; wait for more.
var errMore = errors.New("h1: response incomplete")

// replay reads the bytes a Loop has received for a response; at their end it reports
// errMore, or io.EOF once the peer has closed.
type replay struct {
	b   []byte
	pos int
	eof bool
}

func (r *replay) Read(p []byte) (int, error) {
	if r.pos >= len(r.b) {
		if r.eof {
			return 0, io.EOF
		}
		return 0, errMore
	}
	n := copy(p, r.b[r.pos:])
	r.pos += n
	return n, nil
}

// parser runs the transport's own response parser (readResponse, frame, body) over the bytes
// a Loop has received, so that the loop accepts exactly what the blocking transport accepts
// (and FuzzResponse's guarantees carry over). The parser is prefix-deterministic: it fails on
// a prefix only where it would fail on the whole response, so an attempt that runs out of
// bytes (errMore) is simply repeated when more have arrived. One parser per loop goroutine.
type parser struct {
	t   *Transport // limits
	c   conn
	r   replay
	br  *bufio.Reader
	att Attempt
}

// parsed is the outcome of one parse.
type parsed struct {
	resp        *http.Response // body already read into Body
	consumed    int            // bytes of the input that belong to the response
	reusable    bool           // framed exactly, nothing after it, no close asked for
	nothingRead bool           // the input ended before any byte of a response
	need        int            // after errMore with a known length: input bytes the response needs
	bodyAt      int            // after errMore in the body: where the body starts
	chunked     bool           // ... and it is chunked
}

// parse parses a response to req from b; eof says the peer has closed after b. The error is
// errMore (wrapped) when b is a strict prefix of an acceptable response.
func (p *parser) parse(b []byte, eof bool, req *http.Request) (parsed, error) {
	if p.br == nil {
		p.br = bufio.NewReaderSize(&p.r, readBufSize)
	}
	p.r = replay{b: b, eof: eof}
	p.br.Reset(&p.r)
	p.att.Reset(time.Time{})
	p.c = conn{t: p.t, br: p.br, hbuf: p.c.hbuf, parseOnly: true, att: &p.att, closeWhen: req.Close}
	var out parsed
	resp, nothingRead, err := p.c.readResponse(req)
	if err != nil {
		out.nothingRead = nothingRead
		return out, err
	}
	headEnd := p.r.pos - p.br.Buffered()
	out.bodyAt, out.chunked = headEnd, len(resp.TransferEncoding) > 0
	var body []byte
	switch {
	case resp.Body == http.NoBody:
	case resp.ContentLength >= 0 && len(resp.TransferEncoding) == 0:
		if p.t.MaxBodyBytes > 0 && resp.ContentLength > p.t.MaxBodyBytes {
			_, err = resp.Body.Read(make([]byte, 1)) // the body's own check: ErrBodyTooLarge
			return out, err
		}
		body = make([]byte, resp.ContentLength)
		_, err = io.ReadFull(resp.Body, body)
		if errors.Is(err, errMore) {
			out.need = headEnd + int(resp.ContentLength)
		}
	default:
		body, err = io.ReadAll(resp.Body)
	}
	if err != nil {
		return out, err
	}
	out.bodyAt, out.chunked = 0, false
	resp.Body = &memBody{b: body}
	if body == nil {
		resp.Body = http.NoBody
	}
	out.resp = resp
	out.consumed = p.r.pos - p.br.Buffered()
	out.reusable = p.c.parsedReusable && out.consumed == len(b) && !eof
	return out, nil
}

// memBody is a response body a Loop has read in full.
type memBody struct {
	b   []byte
	off int
}

func (m *memBody) Read(p []byte) (int, error) {
	if m.off >= len(m.b) {
		return 0, io.EOF
	}
	n := copy(p, m.b[m.off:])
	m.off += n
	return n, nil
}

func (m *memBody) Close() error { return nil }

// Bytes returns the unread rest of the body without copying; the caller must not modify it.
func (m *memBody) Bytes() []byte { return m.b[m.off:] }

// framer decides when the bytes received for a response are worth parsing. The parse starts
// from the first byte each time, so running it at every read would let a server that
// trickles its response (a byte per segment, or thousands of one-byte chunks) make the loop
// do quadratic work. The framer follows the response's framing incrementally instead, each
// byte scanned once, and asks for a parse only where one can end: at the end of a head
// (interim ones included), once a known length has arrived, after the last chunk's trailer
// section, at the peer's close, or where the bytes are already malformed or over a limit
// (the parse then fails with the transport's own error). If a parse it asked for still
// needs more, it falls back to asking at each doubling of the input: progress and linear
// work either way.
type framer struct {
	pos       int   // bytes scanned
	lineStart int   // start of the line being scanned (head, size and trailer lines)
	mode      uint8 // what is being scanned
	need      int   // frameLength: input bytes the response needs
	remain    int64 // frameChunkData: data and CRLF bytes left in the chunk
	tried     int   // frameFallback: input bytes at the last parse
}

const (
	frameHead = iota
	frameLength
	frameChunkSize
	frameChunkData
	frameTrailer
	frameEOF
	frameFallback
)

// ready reports whether b (the input so far) should be parsed now.
func (f *framer) ready(b []byte, maxHead int) bool {
	switch f.mode {
	case frameLength:
		return len(b) >= f.need
	case frameEOF:
		return false // at the close, or once over the limit (the caller checks)
	case frameFallback:
		return len(b) >= 2*f.tried
	}
	for f.pos < len(b) {
		switch f.mode {
		case frameChunkData:
			k := min(f.remain, int64(len(b)-f.pos))
			f.pos += int(k)
			f.remain -= k
			if f.remain == 0 {
				f.mode, f.lineStart = frameChunkSize, f.pos
			}
			continue
		}
		i := bytes.IndexByte(b[f.pos:], '\n')
		if i < 0 {
			f.pos = len(b)
			// An over-long line fails the parse at once.
			return f.mode == frameHead && len(b) > maxHead || f.mode != frameHead && len(b)-f.lineStart > readBufSize
		}
		end := f.pos + i + 1
		line := b[f.lineStart:end]
		f.pos, f.lineStart = end, end
		if len(line) < 2 || line[len(line)-2] != '\r' {
			return true // a bare LF: malformed
		}
		switch f.mode {
		case frameHead, frameTrailer:
			if len(line) == 2 {
				return true // the end of a head or of the trailer section
			}
		case frameChunkSize:
			var size int64
			k := 0
			for ; k < len(line) && k < 16; k++ {
				d := unhex(line[k])
				if d < 0 {
					break
				}
				size = size<<4 | int64(d)
			}
			if k == 0 || k > 15 {
				return true // malformed
			}
			if size == 0 {
				f.mode = frameTrailer
			} else {
				f.mode, f.remain = frameChunkData, size+2
			}
		}
	}
	return f.mode == frameHead && len(b) > maxHead
}

// more updates f after a parse of n bytes that needs more input: r says where the final
// response's body starts (0 if its head is incomplete) and how it is framed.
func (f *framer) more(n int, r parsed) {
	switch {
	case f.mode == frameHead && r.bodyAt > 0 && r.need > 0:
		f.mode, f.need = frameLength, r.need
	case f.mode == frameHead && r.bodyAt > 0 && r.chunked:
		f.mode, f.pos, f.lineStart = frameChunkSize, r.bodyAt, r.bodyAt
	case f.mode == frameHead && r.bodyAt > 0:
		f.mode = frameEOF
	case f.mode == frameHead:
		// Head incomplete (an interim response was parsed): scan on.
	default:
		f.mode, f.tried = frameFallback, n
	}
}
