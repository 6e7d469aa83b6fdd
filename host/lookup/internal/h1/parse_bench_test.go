package h1

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// echoConn answers every request written to it with resp, in memory: an exchange without a
// network, so that a benchmark sees only the client's own work.
type echoConn struct {
	resp []byte
	mu   sync.Mutex
	cond *sync.Cond
	buf  []byte
	shut bool
}

func newEchoConn(resp string) *echoConn {
	c := &echoConn{resp: []byte(resp)}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *echoConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.buf = append(c.buf, c.resp...)
	c.cond.Signal()
	c.mu.Unlock()
	return len(p), nil
}

func (c *echoConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.buf) == 0 && !c.shut {
		c.cond.Wait()
	}
	if len(c.buf) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *echoConn) Close() error {
	c.mu.Lock()
	c.shut = true
	c.cond.Broadcast()
	c.mu.Unlock()
	return nil
}
func (c *echoConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *echoConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *echoConn) SetDeadline(time.Time) error      { return nil }
func (c *echoConn) SetReadDeadline(time.Time) error  { return nil }
func (c *echoConn) SetWriteDeadline(time.Time) error { return nil }

// BenchmarkExchange is the client's CPU per exchange, without a network: h1's one-pass
// parser on well-formed responses, h1 on a response only net/http's parser takes (bare LF:
// read by readLenient, on a new connection each time), and net/http's Transport on the
// well-formed ones, side by side in one run.
func BenchmarkExchange(b *testing.B) {
	responses := map[string]string{
		"cl":      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nDate: Tue, 01 Dec 2026 10:00:00 GMT\r\nContent-Length: 27\r\n\r\n{\"country\":\"NL\",\"asn\":1136}",
		"chunked": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1b\r\n{\"country\":\"NL\",\"asn\":1136}\r\n0\r\n\r\n",
		"bare-lf": "HTTP/1.1 200 OK\nContent-Type: application/json\nContent-Length: 27\n\n{\"country\":\"NL\",\"asn\":1136}",
	}
	for _, name := range []string{"cl", "chunked", "bare-lf"} {
		raw := responses[name]
		dial := func(context.Context, string, string) (net.Conn, error) { return newEchoConn(raw), nil }
		b.Run("h1/"+name, func(b *testing.B) {
			tr := &Transport{Dial: dial}
			defer tr.Close()
			benchExchanges(b, tr)
		})
		if name == "bare-lf" {
			continue
		}
		// Without the header map, as host/lookup reads a 200.
		b.Run("h1-noheader/"+name, func(b *testing.B) {
			tr := &Transport{Dial: dial, HeadersFor: func(int) bool { return false }}
			defer tr.Close()
			benchExchanges(b, tr)
		})
		b.Run("std/"+name, func(b *testing.B) {
			tr := &http.Transport{DialContext: dial}
			defer tr.CloseIdleConnections()
			benchExchanges(b, tr)
		})
	}
}

func benchExchanges(b *testing.B, rt http.RoundTripper) {
	req, _ := http.NewRequest("GET", "http://127.0.0.1/geo?ip=1.2.3.4", nil)
	b.ReportAllocs()
	for b.Loop() {
		resp, err := rt.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
	}
}
