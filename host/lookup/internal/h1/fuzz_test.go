package h1

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"reflect"
	"testing"
	"time"
)

// scriptConn is a connection whose peer sends script and then closes.
type scriptConn struct {
	r *bytes.Reader
}

func (c *scriptConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *scriptConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *scriptConn) Close() error                     { return nil }
func (c *scriptConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *scriptConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzResponse feeds arbitrary bytes to the transport as an upstream's answer to one
// request. Properties:
//   - no panic, no hang (the script ends in EOF);
//   - an accepted response honours every limit: status 200-599, at most MaxHeaderCount
//     fields, a body no larger than MaxBodyBytes and exactly Content-Length long when that
//     is given;
//   - a connection goes back to the pool only if its response was framed exactly: every
//     byte of the script consumed, nothing buffered, no error;
//   - never looser than net/http: whatever h1 accepts, net/http's Transport reading
//     (http.ReadResponse, interim responses skipped, the same head limit) accepts with the
//     same status, fields and body, and closes no connection that h1 would keep;
//   - without the header map (HeadersFor false, as host/lookup asks for most statuses), the
//     same outcome: the same error or none, status, body, Close and pooling, a nil Header;
//   - never stricter than net/http: whatever net/http accepts, h1 accepts too, unless it
//     breaks one of h1's own limits (more than MaxHeaderCount field values, a body over
//     MaxBodyBytes, more than maxInterim interim responses) or is what a client that asked
//     for no upgrade must refuse (a status below 100, 101 Switching Protocols).
func FuzzResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\nok\r\n0\r\nT: v\r\n\r\n",
		"HTTP/1.0 404 Not Found\r\n\r\nbody until EOF",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
		"HTTP/1.1 301 Moved\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n",
		"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffff\r\n",
		// What net/http reads and the one-pass parser does not: h1 must read them too.
		"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
		"HTTP/1.1 200 OK\r\nX: a\r\n\tb\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length:  2 \r\n\r\nok",
		"HTTP/1.1  200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 299 Odd\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 600 Beyond\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.2 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0000000000000002;x=\x01 \t\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nT: a\r\n b\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nok\r\n0\r\n\r\n",
		"HTTP/1.1 100 Continue\n\nHTTP/1.1 200 OK\nContent-Length: 1\n\nx",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	const maxFields, maxBody = 16, 1 << 10
	f.Fuzz(func(t *testing.T, script []byte, head bool) {
		sc := &scriptConn{r: bytes.NewReader(script)}
		dials := 0
		tr := &Transport{
			Dial: func(context.Context, string, string) (net.Conn, error) {
				dials++
				if dials > 1 {
					t.Fatal("dialled twice: a fresh connection is never replayed")
				}
				return sc, nil
			},
			MaxResponseHeaderBytes: 2 << 10,
			MaxHeaderCount:         maxFields,
			MaxBodyBytes:           maxBody,
		}
		method := "GET"
		if head {
			method = "HEAD"
		}
		req, _ := http.NewRequest(method, "http://127.0.0.1/x", nil)
		resp, err := tr.RoundTrip(req)
		var body []byte
		if err == nil {
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		tr.pool.mu.Lock()
		pooled := len(tr.pool.idle["127.0.0.1:80"])
		tr.pool.mu.Unlock()

		bare := roundTripScript(t, script, method, maxFields, maxBody)
		if (bare.err == nil) != (err == nil) {
			t.Fatalf("with Header: %v; without: %v", err, bare.err)
		}
		if err == nil && (bare.resp.StatusCode != resp.StatusCode || bare.resp.Status != resp.Status ||
			!bytes.Equal(bare.body, body) || bare.resp.Close != resp.Close || bare.pooled != pooled ||
			bare.resp.ContentLength != resp.ContentLength || bare.resp.Header != nil) {
			t.Fatalf("without Header: %q %q close %v pooled %d length %d header %v; with: %q %q close %v pooled %d length %d",
				bare.resp.Status, bare.body, bare.resp.Close, bare.pooled, bare.resp.ContentLength, bare.resp.Header,
				resp.Status, body, resp.Close, pooled, resp.ContentLength)
		}

		// net/http's Transport reading the same script under the same head limit.
		std := readStd(script, req, tr.MaxResponseHeaderBytes)

		if err != nil {
			if pooled != 0 {
				t.Fatalf("connection pooled after %v", err)
			}
			// Never stricter than net/http, but for h1's own limits.
			if std.err == nil && std.fields <= maxFields && len(std.body) <= maxBody &&
				std.interim <= maxInterim && std.resp.StatusCode >= 100 && std.resp.StatusCode != 101 {
				t.Fatalf("h1 refuses what net/http accepts (%d %q): %v", std.resp.StatusCode, std.body, err)
			}
			return
		}
		if resp.StatusCode < 200 || resp.StatusCode > 999 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		n := 0
		for _, vs := range resp.Header {
			n += len(vs)
		}
		if n > maxFields {
			t.Fatalf("%d fields", n)
		}
		if len(body) > maxBody {
			t.Fatalf("body of %d bytes", len(body))
		}
		if !head && resp.ContentLength >= 0 && int64(len(body)) != resp.ContentLength {
			t.Fatalf("body of %d bytes, Content-Length %d", len(body), resp.ContentLength)
		}
		if pooled > 0 && sc.r.Len() != 0 {
			t.Fatalf("connection pooled with %d bytes of the script unread", sc.r.Len())
		}
		if pooled > 0 && resp.Close {
			t.Fatal("connection pooled although the response closes it")
		}

		// Never looser than net/http: it accepts too, with the same result.
		if std.err != nil {
			t.Fatalf("net/http refuses what h1 accepted: %v", std.err)
		}
		sresp, sbody := std.resp, std.body
		if sresp.StatusCode != resp.StatusCode || !bytes.Equal(sbody, body) {
			t.Fatalf("net/http: %d %q; h1: %d %q", sresp.StatusCode, sbody, resp.StatusCode, body)
		}
		delete(sresp.Header, "Trailer") // net/http moves declared trailers out of the header
		got := resp.Header.Clone()
		delete(got, "Trailer")
		if len(got) != 0 || len(sresp.Header) != 0 {
			if !reflect.DeepEqual(got, sresp.Header) {
				t.Fatalf("fields differ:\nnet/http %q\nh1       %q", sresp.Header, got)
			}
		}
		if sresp.Close && !resp.Close || sresp.Close && pooled > 0 {
			t.Fatalf("net/http closes the connection, h1 keeps it (Close %v, pooled %d)", resp.Close, pooled)
		}
	})
}

type scriptResult struct {
	resp   *http.Response
	body   []byte
	pooled int
	err    error
}

// roundTripScript runs one request over a connection that answers script, with a transport
// that builds no Header (HeadersFor false for every status).
func roundTripScript(t *testing.T, script []byte, method string, maxFields int, maxBody int64) (r scriptResult) {
	sc := &scriptConn{r: bytes.NewReader(script)}
	tr := &Transport{
		Dial:                   func(context.Context, string, string) (net.Conn, error) { return sc, nil },
		MaxResponseHeaderBytes: 2 << 10,
		MaxHeaderCount:         maxFields,
		MaxBodyBytes:           maxBody,
		HeadersFor:             func(int) bool { return false },
	}
	req, _ := http.NewRequest(method, "http://127.0.0.1/x", nil)
	r.resp, r.err = tr.RoundTrip(req)
	if r.err == nil {
		r.body, r.err = io.ReadAll(r.resp.Body)
		r.resp.Body.Close()
	}
	tr.pool.mu.Lock()
	r.pooled = len(tr.pool.idle["127.0.0.1:80"])
	tr.pool.mu.Unlock()
	return r
}

// stdResult is how net/http's Transport reads a script.
type stdResult struct {
	resp    *http.Response // the final response (also set with err, when one was read)
	body    []byte
	fields  int // field values of the response with the most
	interim int // interim responses skipped
	err     error
}

// readStd reads script as net/http's Transport does: http.ReadResponse over a reader of
// its buffer size, interim (1xx but 101) responses skipped, at most maxHead bytes read
// while reading heads (read-ahead included), then the whole body.
func readStd(script []byte, req *http.Request, maxHead int) (r stdResult) {
	lim := &headLimit{r: bytes.NewReader(script), left: int64(maxHead)}
	br := bufio.NewReaderSize(lim, readBufSize)
	for {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			r.err = err
			return r
		}
		n := 0
		for _, vs := range resp.Header {
			n += len(vs)
		}
		r.fields = max(r.fields, n)
		r.resp = resp
		if resp.StatusCode >= 100 && resp.StatusCode <= 199 && resp.StatusCode != 101 {
			r.interim++
			continue
		}
		lim.left = math.MaxInt64
		r.body, r.err = io.ReadAll(resp.Body)
		return r
	}
}
