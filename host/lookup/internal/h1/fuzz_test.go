package h1

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
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
//   - the parser is stricter than net/http's, never looser: whatever it accepts (without
//     interim responses), http.ReadResponse accepts with the same status, fields and body.
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
		if err != nil {
			if pooled != 0 {
				t.Fatalf("connection pooled after %v", err)
			}
			return
		}
		if resp.StatusCode < 200 || resp.StatusCode > 599 {
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

		// Differential: net/http accepts it too, with the same result.
		if bytes.HasPrefix(script, []byte("HTTP/1.1 1")) || bytes.HasPrefix(script, []byte("HTTP/1.0 1")) {
			return // interim responses are skipped here, returned by ReadResponse
		}
		sresp, err := http.ReadResponse(bufio.NewReaderSize(bytes.NewReader(script), readBufSize), req)
		if err != nil {
			t.Fatalf("net/http refuses what h1 accepted: %v", err)
		}
		sbody, err := io.ReadAll(sresp.Body)
		if err != nil {
			t.Fatalf("net/http fails on the body h1 accepted: %v", err)
		}
		if sresp.StatusCode != resp.StatusCode || !bytes.Equal(sbody, body) {
			t.Fatalf("net/http: %d %q; h1: %d %q", sresp.StatusCode, sbody, resp.StatusCode, body)
		}
		delete(sresp.Header, "Trailer") // net/http moves declared trailers out of the header
		got := resp.Header.Clone()
		delete(got, "Trailer")
		if len(got) == 0 && len(sresp.Header) == 0 {
			return
		}
		if !reflect.DeepEqual(got, sresp.Header) {
			t.Fatalf("fields differ:\nnet/http %q\nh1       %q", sresp.Header, got)
		}
		if sresp.Close != resp.Close && !strings.EqualFold(resp.Proto, "HTTP/1.0") {
			t.Fatalf("Close: net/http %v, h1 %v", sresp.Close, resp.Close)
		}
	})
}
