package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

// readResponse reads the final response to req from c (interim 1xx responses are skipped)
// and returns it with a body that reads from c. nothingRead reports that the connection
// failed before a single byte of a response arrived; at is when the final response's head
// had been read (it is also c's idle mark, set before the body can give c back to the pool).
//
// The one-pass parser below takes the well-formed response (CRLF line ends, no obs-fold,
// unambiguous framing) and refuses everything else. What it refuses, readLenient reads
// again with net/http's own parser, so that h1 is never stricter than net/http: an upstream
// that net/http reads fine never trips the breaker here (FuzzResponse checks both ways).
func (c *conn) readResponse(req *http.Request) (_ *http.Response, at time.Time, nothingRead bool, _ error) {
	t := c.t
	budget := t.MaxResponseHeaderBytes
	for interim := 0; ; interim++ {
		head, fields, err := readHead(c.br, c.hbuf[:0], budget, t.MaxHeaderCount)
		if _, ok := err.(*ProtocolError); ok && err != errHeadTooLarge {
			resp, err := c.readLenient(req, head, budget, interim)
			return resp, time.Now(), false, err
		}
		if err != nil {
			if err == errHeadTooLarge {
				err = protoErr("response head larger than " + strconv.Itoa(t.MaxResponseHeaderBytes) + " bytes")
			}
			if interim == 0 && len(head) == 0 {
				if err == io.EOF {
					err = errServerClosed
				}
				return nil, at, true, err
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, at, false, err
		}
		if cap(head) <= 2*readBufSize {
			c.hbuf = head[:0]
		}
		budget -= len(head)
		resp, fr, err := parseHead(head, fields, t.HeadersFor)
		if err != nil {
			resp, err := c.readLenient(req, head, budget+len(head), interim)
			return resp, time.Now(), false, err
		}
		if resp.StatusCode < 200 {
			if resp.StatusCode == http.StatusSwitchingProtocols {
				return nil, at, false, protoErr("101 Switching Protocols to a request that asked for no upgrade")
			}
			if interim >= maxInterim {
				return nil, at, false, protoErr("too many interim responses")
			}
			continue
		}
		resp.Request = req
		at = time.Now()
		c.idleAt = at // before frame: a body that is already over gives c back to the pool
		if err := c.frame(resp, &fr, req.Method); err != nil {
			resp, err := c.readLenient(req, head, budget+len(head), interim)
			return resp, at, false, err
		}
		return resp, at, false, nil
	}
}

// readLenient reads the response whose first bytes, consumed, the one-pass parser refused
// (the rest is still in c.br) with http.ReadResponse, under the same limits: budget bytes of
// head from the start of consumed (interim responses included, as net/http's Transport
// counts them), MaxHeaderCount field values, MaxBodyBytes of body, the interim count so far.
// The connection is never reused after such a response: it is closed after the body.
func (c *conn) readLenient(req *http.Request, consumed []byte, budget, interim int) (*http.Response, error) {
	t := c.t
	c.closeWhen = true
	lim := &headLimit{r: io.MultiReader(bytes.NewReader(consumed), c.br), left: int64(budget)}
	br := bufio.NewReaderSize(lim, readBufSize)
	for ; ; interim++ {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			if _, ok := err.(*ProtocolError); !ok && err != io.ErrUnexpectedEOF && !isNetError(err) {
				err = &ProtocolError{Reason: err.Error()} // net/http's parse errors are plain
			}
			return nil, err
		}
		n := 0
		for _, vs := range resp.Header {
			n += len(vs)
		}
		switch {
		case resp.StatusCode < 100:
			err = protoErr("bad status code") // not a status (RFC 9110 §15); the ABI has no room for it
		case n > t.MaxHeaderCount:
			err = protoErr("more than " + strconv.Itoa(t.MaxHeaderCount) + " header fields")
		case resp.StatusCode == http.StatusSwitchingProtocols:
			err = protoErr("101 Switching Protocols to a request that asked for no upgrade")
		case resp.StatusCode < 200 && interim >= maxInterim:
			err = protoErr("too many interim responses")
		}
		if err != nil {
			resp.Body.Close()
			return nil, err
		}
		if resp.StatusCode < 200 {
			continue
		}
		lim.left = math.MaxInt64 // the body is bounded by MaxBodyBytes instead
		resp.Close = true
		if t.HeadersFor != nil && !t.HeadersFor(resp.StatusCode) {
			resp.Header = nil // as the one-pass parser leaves it
		}
		if resp.Body == http.NoBody {
			c.fail()
			return resp, nil
		}
		resp.Body = &lenientBody{bodyConn: bodyConn{c: c}, r: resp.Body, limit: t.MaxBodyBytes}
		return resp, nil
	}
}

// headLimit bounds the bytes net/http's parser may read for a head, as net/http's Transport
// bounds them (its read-ahead counts too).
type headLimit struct {
	r    io.Reader
	left int64
}

var errHeadTooLarge = protoErr("response head too large")

func (l *headLimit) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

func isNetError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, net.ErrClosed)
}

// lenientBody is the body of a response read by readLenient: net/http's body reader over
// the connection, within MaxBodyBytes; the connection is closed at its end.
type lenientBody struct {
	bodyConn
	r     io.ReadCloser
	total int64
	limit int64
}

func (b *lenientBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.r.Read(p)
	b.total += int64(n)
	if b.limit > 0 && b.total > b.limit {
		return 0, b.fail(ErrBodyTooLarge)
	}
	if err == io.EOF {
		b.c.fail() // never reused
		b.c, b.err = nil, io.EOF
		return n, io.EOF
	}
	if err != nil {
		return n, b.fail(err)
	}
	return n, nil
}

// readHead reads a response head (status line and header fields, up to and including the
// empty line) into buf, and returns it with the number of header field lines. The head may
// take at most maxBytes and hold at most maxFields fields.
func readHead(br *bufio.Reader, buf []byte, maxBytes, maxFields int) (head []byte, fields int, err error) {
	lineStart := 0
	for {
		line, err := br.ReadSlice('\n')
		if len(buf)+len(line) > maxBytes {
			return buf, 0, errHeadTooLarge
		}
		buf = append(buf, line...)
		if err == bufio.ErrBufferFull {
			continue // a long line: keep reading it
		}
		if err != nil {
			return buf, 0, err
		}
		if len(buf)-lineStart < 2 || buf[len(buf)-2] != '\r' {
			return buf, 0, protoErr("line not ended by CRLF") // now, not after waiting for more
		}
		if len(buf)-lineStart == 2 {
			if lineStart == 0 {
				return buf, 0, protoErr("empty line instead of a status line")
			}
			return buf, fields, nil
		}
		if lineStart > 0 {
			fields++
			if fields > maxFields {
				return buf, 0, protoErr("more than " + strconv.Itoa(maxFields) + " header fields")
			}
		}
		lineStart = len(buf)
	}
}

// parseHead parses a head read by readHead. When the caller reads the header fields of a
// response with this status (headersFor nil, or true for it), Header is built: its keys and
// values are substrings of one copy of head (one allocation for the text, one for the
// values, one for the map). Otherwise (and for interim responses, which are skipped) Header
// is nil and nothing of head is copied: every field is still parsed and checked, and the
// ones that frame the body are collected in the framing, which holds substrings of head
// itself (valid until the connection's next read into it).
func parseHead(head []byte, fields int, headersFor func(int) bool) (*http.Response, framing, error) {
	var fr framing
	s := unsafe.String(unsafe.SliceData(head), len(head))
	line, rest, err := nextLine(s)
	if err != nil {
		return nil, fr, err
	}
	ra := &responseAlloc{resp: http.Response{ContentLength: -1}}
	resp := &ra.resp
	fr.body = &ra.body
	if err := parseStatusLine(line, resp); err != nil {
		return nil, fr, err
	}
	var vals []string
	if keep := resp.StatusCode >= 200 && (headersFor == nil || headersFor(resp.StatusCode)); keep {
		s = string(head)
		line, rest, _ = nextLine(s)
		resp.Status = line[9:]
		resp.Header = make(http.Header, fields)
		vals = make([]string, fields)
	} else if st := line[9:]; st == "200 OK" {
		resp.Status = "200 OK"
	} else {
		resp.Status = strings.Clone(st)
	}
	for i := 0; ; i++ {
		line, rest, err = nextLine(rest)
		if err != nil {
			return nil, fr, err
		}
		if line == "" {
			break
		}
		name, v, err := parseField(line)
		if err != nil {
			return nil, fr, err
		}
		fr.add(name, v)
		if resp.Header == nil {
			continue
		}
		k := canonicalKey(name)
		if old, ok := resp.Header[k]; ok {
			resp.Header[k] = append(old, v)
		} else {
			vals[i] = v
			resp.Header[k] = vals[i : i+1 : i+1]
		}
	}
	return resp, fr, nil
}

// responseAlloc is a response and its body reader in one allocation.
type responseAlloc struct {
	resp http.Response
	body body
}

// framing is what delimiting a response's body needs of its header fields (RFC 9112 §6.3).
type framing struct {
	body      *body  // the response's body reader, allocated with it
	close     bool   // a Connection field lists "close"
	te, cl    string // the first Transfer-Encoding and Content-Length values
	nTE, nCL  int    // how many values each has
	clDiffers bool   // two Content-Length values differ
}

// add notes the field name: v if it frames the body. Names compare case-insensitively, as
// their canonical forms do (a token is ASCII).
func (fr *framing) add(name, v string) {
	switch {
	case len(name) == len("Connection") && strings.EqualFold(name, "Connection"):
		fr.close = fr.close || hasToken(v, "close")
	case len(name) == len("Transfer-Encoding") && strings.EqualFold(name, "Transfer-Encoding"):
		if fr.nTE == 0 {
			fr.te = v
		}
		fr.nTE++
	case len(name) == len("Content-Length") && strings.EqualFold(name, "Content-Length"):
		if fr.nCL == 0 {
			fr.cl = v
		} else if v != fr.cl {
			fr.clDiffers = true
		}
		fr.nCL++
	}
}

// nextLine splits s after its first CRLF. A CR anywhere else is an error (LF only ends
// lines, by construction of readHead).
func nextLine(s string) (line, rest string, err error) {
	i := strings.IndexByte(s, '\n')
	if i < 1 || s[i-1] != '\r' {
		return "", "", protoErr("line not ended by CRLF")
	}
	line = s[:i-1]
	if strings.IndexByte(line, '\r') >= 0 {
		return "", "", protoErr("CR inside a line")
	}
	return line, s[i+1:], nil
}

// parseStatusLine: HTTP-version SP 3DIGIT [SP reason-phrase] (RFC 9112 §4; the missing SP
// before an empty reason is tolerated, as every client does).
func parseStatusLine(l string, resp *http.Response) error {
	switch {
	case strings.HasPrefix(l, "HTTP/1.1 "):
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	case strings.HasPrefix(l, "HTTP/1.0 "):
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.0", 1, 0
	default:
		return protoErr("status line does not start with HTTP/1.1 or HTTP/1.0")
	}
	if len(l) < 12 || l[9] < '1' || l[9] > '5' || !isDigit(l[10]) || !isDigit(l[11]) {
		return protoErr("bad status code")
	}
	if len(l) > 12 && (l[12] != ' ' || !validValue(l[13:])) {
		return protoErr("bad reason phrase")
	}
	resp.StatusCode = int(l[9]-'0')*100 + int(l[10]-'0')*10 + int(l[11]-'0')
	resp.Status = l[9:]
	return nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// parseField: field-name ":" OWS field-value OWS (the name as it came), with the name a token right before the
// colon (no whitespace: RFC 9112 §5.1) and no obs-fold (a line starting with whitespace has
// no token before its colon).
func parseField(l string) (k, v string, err error) {
	colon := strings.IndexByte(l, ':')
	if colon <= 0 || !isToken(l[:colon]) {
		return "", "", protoErr("bad header field name")
	}
	v = trimOWS(l[colon+1:])
	if !validValue(v) {
		return "", "", protoErr("control byte in header field value")
	}
	return l[:colon], v, nil
}

// canonicalKey is textproto.CanonicalMIMEHeaderKey without an allocation when the name is
// already canonical (the usual case).
func canonicalKey(k string) string {
	upper := true
	for i := 0; i < len(k); i++ {
		c := k[i]
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			return http.CanonicalHeaderKey(k)
		}
		upper = c == '-'
	}
	return k
}

// frame decides how the body of resp is delimited (RFC 9112 §6.3), by the fields fr
// collected, and attaches it.
func (c *conn) frame(resp *http.Response, fr *framing, method string) error {
	h := resp.Header // nil if the caller does not read it
	if fr.close {
		c.closeWhen = true
		if resp.ProtoMinor == 1 && h != nil {
			delete(h, "Connection") // as net/http does: Close says it
		}
	}
	c.closeWhen = c.closeWhen || resp.ProtoMinor == 0
	resp.Close = c.closeWhen
	hasTE, hasCL := fr.nTE > 0, fr.nCL > 0
	if hasTE && hasCL {
		return protoErr("both Transfer-Encoding and Content-Length") // a smuggling vector; refuse
	}
	if hasTE && (resp.ProtoMinor == 0 || fr.nTE != 1 || !strings.EqualFold(fr.te, "chunked")) {
		return protoErr("unsupported Transfer-Encoding")
	}
	if hasTE {
		if h != nil {
			delete(h, "Transfer-Encoding") // moved to TransferEncoding, as net/http does
		}
		resp.TransferEncoding = []string{"chunked"}
	}
	cl := int64(-1)
	if hasCL {
		if fr.clDiffers {
			return protoErr("conflicting Content-Length values")
		}
		if h != nil {
			h["Content-Length"] = h["Content-Length"][:1]
		}
		n, ok := parseLength(fr.cl)
		if !ok {
			return protoErr("bad Content-Length")
		}
		cl = n
	}
	noBody := method == http.MethodHead || resp.StatusCode == http.StatusNoContent ||
		resp.StatusCode == http.StatusNotModified
	switch {
	case noBody:
		resp.ContentLength = cl
		if method != http.MethodHead {
			resp.ContentLength = 0
		}
		resp.Body = http.NoBody
		c.finish()
	case hasTE:
		*fr.body = body{bodyConn: bodyConn{c: c}, mode: modeChunked, limit: c.t.MaxBodyBytes, overhead: -maxChunkOverhead}
		resp.Body = fr.body
	case cl == 0:
		resp.ContentLength = 0
		resp.Body = http.NoBody
		c.finish()
	case cl > 0:
		resp.ContentLength = cl
		*fr.body = body{bodyConn: bodyConn{c: c}, mode: modeLength, remain: cl, limit: c.t.MaxBodyBytes}
		resp.Body = fr.body
	default:
		// Delimited by the connection closing: valid, never reusable.
		c.closeWhen = true
		resp.Close = true
		*fr.body = body{bodyConn: bodyConn{c: c}, mode: modeEOF, limit: c.t.MaxBodyBytes}
		resp.Body = fr.body
	}
	return nil
}

// parseLength parses 1*DIGIT without overflow (at most 18 digits).
func parseLength(s string) (int64, bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return 0, false
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n, true
}

// hasToken reports whether a comma-separated field value lists tok (case-insensitively).
func hasToken(v, tok string) bool {
	for v != "" {
		var item string
		item, v, _ = strings.Cut(v, ",")
		if strings.EqualFold(trimOWS(item), tok) {
			return true
		}
	}
	return false
}

const (
	modeLength = iota
	modeChunked
	modeEOF

	maxChunkOverhead = 16 << 10 // non-data bytes a chunked body may carry beyond 16 per chunk
)

// body is a response body read from its connection. When it has been read to its exact end
// the connection goes back to the pool at once (before the caller's next Read or Close);
// on any error, or a Close before the end, the connection is closed. Not safe for
// concurrent use; cancel through the request's context.
type body struct {
	bodyConn
	mode     uint8
	remain   int64 // bytes left in the body (modeLength) or in the current chunk
	total    int64 // bytes delivered
	limit    int64 // MaxBodyBytes; 0: none
	overhead int64 // chunk framing bytes read, minus what is allowed
	inChunk  bool  // inside a chunk's data (modeChunked)
	crlfDue  bool  // the CRLF after a chunk's data is next (modeChunked)
}

func (b *body) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	switch b.mode {
	case modeLength:
		if b.limit > 0 && b.total == 0 && b.remain > b.limit {
			return 0, b.fail(ErrBodyTooLarge)
		}
		if int64(len(p)) > b.remain {
			p = p[:b.remain]
		}
		n, err := b.c.br.Read(p)
		b.remain -= int64(n)
		b.total += int64(n)
		if b.remain == 0 {
			b.end()
			return n, nil // io.EOF on the next call; the connection is already back
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return n, b.fail(err)
		}
		return n, nil
	case modeEOF:
		n, err := b.c.br.Read(p)
		b.total += int64(n)
		if b.limit > 0 && b.total > b.limit {
			return 0, b.fail(ErrBodyTooLarge)
		}
		if err == io.EOF {
			b.c.fail() // never reusable
			b.c, b.err = nil, io.EOF
			return n, nil
		}
		if err != nil {
			return n, b.fail(err)
		}
		return n, nil
	default:
		return b.readChunked(p)
	}
}

func (b *body) readChunked(p []byte) (int, error) {
	if !b.inChunk {
		if b.crlfDue {
			if err := b.expectCRLF(); err != nil {
				return 0, b.fail(err)
			}
			b.crlfDue = false
		}
		size, err := b.chunkSize()
		if err != nil {
			return 0, b.fail(err)
		}
		if size == 0 {
			if err := b.trailers(); err != nil {
				return 0, b.fail(err)
			}
			b.end()
			return 0, io.EOF
		}
		if b.limit > 0 && b.total+size > b.limit {
			return 0, b.fail(ErrBodyTooLarge)
		}
		b.remain, b.inChunk = size, true
	}
	if int64(len(p)) > b.remain {
		p = p[:b.remain]
	}
	n, err := b.c.br.Read(p)
	b.remain -= int64(n)
	b.total += int64(n)
	if b.remain == 0 {
		b.inChunk, b.crlfDue = false, true
	}
	if err != nil && (b.inChunk || err != io.EOF) {
		return n, b.fail(eofUnexpected(err))
	}
	return n, nil
}

func (b *body) expectCRLF() error {
	br := b.c.br
	c1, err := br.ReadByte()
	if err != nil {
		return eofUnexpected(err)
	}
	c2, err := br.ReadByte()
	if err != nil {
		return eofUnexpected(err)
	}
	if c1 != '\r' || c2 != '\n' {
		return protoErr("chunk data not followed by CRLF")
	}
	return nil
}

// chunkSize reads `1*16HEXDIG [OWS] [";" chunk-ext] CRLF` exactly as net/http's chunked
// reader does (never stricter, never looser): a CR only before the LF, trailing SP or HTAB
// ignored, the extension ignored whatever it holds; all framing counts against an overhead
// budget (net/http's), so that a hostile server cannot send unbounded non-data.
func (b *body) chunkSize() (int64, error) {
	line, err := b.c.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		return 0, protoErr("chunk size line too long")
	}
	if err != nil {
		return 0, eofUnexpected(err)
	}
	b.overhead += int64(len(line)) // the line and its CRLF, the CRLF after the data
	if cr := bytes.IndexByte(line, '\r'); len(line) < 2 || cr != len(line)-2 {
		return 0, protoErr("chunk size line not ended by CRLF, or a CR inside it")
	}
	line = line[:len(line)-2]
	if len(line) >= 4096 {
		return 0, protoErr("chunk size line too long")
	}
	for len(line) > 0 && (line[len(line)-1] == ' ' || line[len(line)-1] == '\t') {
		line = line[:len(line)-1]
	}
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	if len(line) == 0 || len(line) > 16 {
		return 0, protoErr("bad chunk size")
	}
	var usize uint64
	for _, c := range line {
		d := unhex(c)
		if d < 0 {
			return 0, protoErr("bad chunk size")
		}
		usize = usize<<4 | uint64(d)
	}
	if usize > math.MaxInt64 {
		return 0, ErrBodyTooLarge // no body this long ends before its connection does
	}
	size := int64(usize)
	b.overhead -= 16 + 2*size
	b.overhead = max(b.overhead, -maxChunkOverhead)
	if b.overhead > 0 {
		return 0, protoErr("chunked body carries too much non-data")
	}
	return size, nil
}

// trailers reads the trailer section and discards it, exactly as net/http's body does: an
// empty one is a CRLF; otherwise a CRLF CRLF must come within the read buffer (which bounds
// the section at 4 KiB, net/http's default buffer), and textproto parses what precedes it.
func (b *body) trailers() error {
	br := b.c.br
	if p, _ := br.Peek(2); len(p) == 2 && p[0] == '\r' && p[1] == '\n' {
		br.Discard(2)
		return nil
	} else if len(p) < 2 {
		return io.ErrUnexpectedEOF
	}
	for peek := 4; ; peek++ {
		p, err := br.Peek(peek)
		if bytes.HasSuffix(p, []byte("\r\n\r\n")) {
			break
		}
		if err != nil {
			if err == bufio.ErrBufferFull {
				return protoErr("trailer section longer than the read buffer")
			}
			return io.ErrUnexpectedEOF
		}
	}
	if _, err := textproto.NewReader(br).ReadMIMEHeader(); err != nil {
		if err == io.EOF {
			return io.ErrUnexpectedEOF
		}
		return &ProtocolError{Reason: "trailer: " + err.Error()}
	}
	return nil
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func eofUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// end hands the connection back after the body's last byte.
func (b *body) end() {
	c := b.c
	b.c, b.err = nil, io.EOF
	c.finish()
}

// bodyConn is what a response body holds of its connection: the connection until the body
// is finished, and the sticky error after.
type bodyConn struct {
	c   *conn // nil once finished
	err error // sticky: io.EOF after the end
}

// fail closes the connection and makes err sticky.
func (b *bodyConn) fail(err error) error {
	if b.c != nil {
		err = b.c.ioError("read body", err)
		b.c.fail()
		b.c = nil
	}
	b.err = err
	return err
}

// Close closes the connection unless the body was read to its end.
func (b *bodyConn) Close() error {
	if b.c != nil {
		b.c.fail()
		b.c = nil
		b.err = errBodyClosed
	}
	return nil
}

var errBodyClosed = &opError{op: "read body", err: io.ErrClosedPipe}
