package uring

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// loopbackOnly is a Dialer.Control that fails the test for any address but 127.0.0.1.
func loopbackOnly(t testing.TB) func(network, address string) error {
	return func(network, address string) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil || host != "127.0.0.1" {
			t.Errorf("dial of %s %s: only 127.0.0.1 is allowed", network, address)
			return errors.New("refused: not loopback")
		}
		return nil
	}
}

func bodyServer(t testing.TB) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.Write(bytes.Repeat([]byte{'x'}, n))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func uringClient(t testing.TB, r *Reactor, conns int) *http.Client {
	d := &Dialer{Reactor: r, Control: loopbackOnly(t)}
	tr := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: conns}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func TestDialerHTTP(t *testing.T) {
	forEachBackend(t, func(t *testing.T, force Option) {
		r := newReactor(t, force)
		srv := bodyServer(t)
		client := uringClient(t, r, 4)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				for _, n := range []int{0, 1, 1 << 10, 1 << 20} {
					resp, err := client.Get(fmt.Sprintf("%s/?n=%d&i=%d", srv.URL, n, i))
					if err != nil {
						t.Error(err)
						return
					}
					body, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || len(body) != n || bytes.Count(body, []byte{'x'}) != n {
						t.Errorf("GET n=%d: %d bytes, %v", n, len(body), err)
					}
				}
			})
		}
		wg.Wait()
	})
}

func TestDialerDeadlineAndClose(t *testing.T) {
	forEachBackend(t, func(t *testing.T, force Option) {
		r := newReactor(t, force)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		var held []net.Conn
		var mu sync.Mutex
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				held = append(held, c) // accept, never answer
				mu.Unlock()
			}
		}()
		defer func() {
			mu.Lock()
			for _, c := range held {
				c.Close()
			}
			mu.Unlock()
		}()
		d := &Dialer{Reactor: r, Control: loopbackOnly(t)}
		ctx := ctxTimeout(t, 10*time.Second)

		c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		// The server never writes, so only the deadline can end this Read (ctx bounds the test).
		c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
		_, err = c.Read(make([]byte, 16))
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("Read past the deadline: %v, want a timeout", err)
		}

		// A deadline set while a Read is pending applies to it.
		c.SetReadDeadline(time.Time{})
		readErr := make(chan error, 1)
		go func() { _, err := c.Read(make([]byte, 16)); readErr <- err }()
		time.Sleep(20 * time.Millisecond)
		c.SetReadDeadline(time.Now())
		if err := <-readErr; !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("pending Read after SetReadDeadline(now): %v", err)
		}

		// Close interrupts a pending Read.
		c.SetReadDeadline(time.Time{})
		go func() { _, err := c.Read(make([]byte, 16)); readErr <- err }()
		time.Sleep(20 * time.Millisecond)
		waitOrFail(t, 5*time.Second, "Close with a pending Read", func() {
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		if err := <-readErr; !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read interrupted by Close: %v, want net.ErrClosed", err)
		}
		if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Write after Close: %v", err)
		}

		// Control sees the resolved address and can refuse it.
		refusing := &Dialer{Reactor: r, Control: func(string, string) error { return errors.New("policy") }}
		if _, err := refusing.DialContext(ctx, "tcp", ln.Addr().String()); err == nil {
			t.Fatal("Control refused the address but the dial succeeded")
		}
		// Nobody listening: ECONNREFUSED through the OpError.
		ln2, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := ln2.Addr().String()
		ln2.Close()
		if _, err := d.DialContext(ctx, "tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial of a closed port: %v, want ECONNREFUSED", err)
		}
	})
}

// BenchmarkHTTPClient compares GETs over loopback through an http.Client whose transport dials
// with the io_uring Dialer against the standard transport, in the same run, with 1 and 16
// requests outstanding and 1 KiB and 64 KiB bodies.
func BenchmarkHTTPClient(b *testing.B) {
	if err := Available(); err != nil {
		b.Skipf("io_uring unavailable here: %v", err)
	}
	srv := bodyServer(b)
	for _, size := range []int{1 << 10, 64 << 10} {
		for _, conc := range []int{1, 16} {
			b.Run(fmt.Sprintf("body=%dKiB/conc=%d", size>>10, conc), func(b *testing.B) {
				r := newReactor(b, WithBackend(BackendIOUring))
				ring := uringClient(b, r, conc)
				stdTr := &http.Transport{MaxIdleConnsPerHost: conc}
				defer stdTr.CloseIdleConnections()
				std := &http.Client{Transport: stdTr}
				url := fmt.Sprintf("%s/?n=%d", srv.URL, size)
				run := func(c *http.Client, n int) time.Duration {
					var next atomic.Int64
					var wg sync.WaitGroup
					start := time.Now()
					for range conc {
						wg.Go(func() {
							for next.Add(1) <= int64(n) {
								resp, err := c.Get(url)
								if err != nil {
									b.Error(err)
									return
								}
								io.Copy(io.Discard, resp.Body)
								resp.Body.Close()
							}
						})
					}
					wg.Wait()
					return time.Since(start)
				}
				run(ring, conc) // establish the connections outside the timing
				run(std, conc)
				b.ResetTimer()
				cmp := interleave(b.N, benchRounds, func(n int) time.Duration { return run(ring, n) },
					func(n int) time.Duration { return run(std, n) })
				b.ReportMetric(cmp.rateA, "uring-req/s")
				b.ReportMetric(cmp.rateB, "std-req/s")
				b.ReportMetric(cmp.ratio, "uring/std")
			})
		}
	}
}

// TestDialerMoreConnsThanEntries is the regression test for the hang host/lookup's
// BenchmarkTransport hit at 256 requests in flight: more connections than the reactor has ring
// entries (or pool workers), each keeping a Read pending at all times, as http.Transport's
// readLoop does, while its writer does request/response ping-pong. A pending socket read ends
// only when the peer answers, and the peer answers only once the request's Write has run, so
// the Write must never wait behind those reads for capacity.
//
// On failure it reports the reactor's state, closes every connection (which cancels what is
// pending) and waits for its goroutines, so a hang fails this test in bounded time instead of
// hanging the binary.
func TestDialerMoreConnsThanEntries(t *testing.T) {
	forEachBackend(t, func(t *testing.T, force Option) {
		const entries, conns, rounds, msg = 8, 32, 40, 16
		r := newReactor(t, force, WithEntries(entries), WithWorkers(entries))
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var served sync.WaitGroup
		var srvConns []net.Conn
		var srvMu sync.Mutex
		served.Go(func() { // echo server on the standard library
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				srvMu.Lock()
				srvConns = append(srvConns, c)
				srvMu.Unlock()
				served.Go(func() { io.Copy(c, c) })
			}
		})
		defer func() {
			ln.Close()
			srvMu.Lock()
			for _, c := range srvConns {
				c.Close()
			}
			srvMu.Unlock()
			served.Wait()
		}()

		d := &Dialer{Reactor: r, Control: loopbackOnly(t)}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var clients []net.Conn
		for range conns {
			c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			clients = append(clients, c)
		}

		var exchanged atomic.Int64
		var wg sync.WaitGroup
		for i, c := range clients {
			echoes := make(chan []byte, 1)
			wg.Go(func() { // reader: a Read always pending, like http.Transport's readLoop
				defer close(echoes)
				var pending []byte
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					pending = append(pending, buf[:n]...)
					for len(pending) >= msg {
						echoes <- pending[:msg:msg]
						pending = pending[msg:]
					}
				}
			})
			wg.Go(func() { // writer: one request at a time, waiting for its answer
				defer c.Close() // ends the reader
				for j := range rounds {
					req := fmt.Appendf(nil, "c%03d r%04d      ", i, j)[:msg]
					if _, err := c.Write(req); err != nil {
						if ctx.Err() == nil {
							t.Errorf("conn %d: Write: %v", i, err)
						}
						return
					}
					select {
					case got, ok := <-echoes:
						if !ok || !bytes.Equal(got, req) {
							if ctx.Err() == nil {
								t.Errorf("conn %d round %d: echo %q (ok %v), want %q", i, j, got, ok, req)
							}
							return
						}
					case <-ctx.Done():
						return
					}
					exchanged.Add(1)
				}
			})
		}
		finished := make(chan struct{})
		go func() { wg.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-ctx.Done():
			t.Errorf("no progress after %d of %d exchanges: %s", exchanged.Load(), conns*rounds, reactorState(r))
			for _, c := range clients {
				c.Close()
			}
			select {
			case <-finished:
			case <-time.After(10 * time.Second):
				buf := make([]byte, 1<<20)
				t.Fatalf("connections still busy 10s after Close\n%s", buf[:runtime.Stack(buf, true)])
			}
		}
		if got := exchanged.Load(); got != conns*rounds && !t.Failed() {
			t.Fatalf("%d exchanges, want %d", got, conns*rounds)
		}
	})
}

// TestDialerCancelRaces races Close and deadlines with Reads that are just being submitted. A
// cancellation that reaches the engine before the operation does must not be lost: Close would
// then wait forever for a read nothing ends, and a Read reported as timed out would still be
// running, its bytes lost from the stream when they arrive.
func TestDialerCancelRaces(t *testing.T) {
	forEachBackend(t, func(t *testing.T, force Option) {
		r := newReactor(t, force)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		const streamLen = 20_000
		stream := make([]byte, streamLen)
		for i := range stream {
			stream[i] = byte(i * 7)
		}
		var served sync.WaitGroup
		var srvConns []net.Conn
		var srvMu sync.Mutex
		served.Go(func() {
			for i := 0; ; i++ {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				srvMu.Lock()
				srvConns = append(srvConns, c)
				srvMu.Unlock()
				if i > 0 {
					continue // Close race: never answer
				}
				served.Go(func() { // deadline race: the stream in small chunks, a little at a time
					for off := 0; off < len(stream); off += 100 {
						if _, err := c.Write(stream[off : off+100]); err != nil {
							return
						}
						time.Sleep(50 * time.Microsecond)
					}
				})
			}
		})
		defer func() {
			ln.Close()
			srvMu.Lock()
			for _, c := range srvConns {
				c.Close()
			}
			srvMu.Unlock()
			served.Wait()
		}()
		d := &Dialer{Reactor: r, Control: loopbackOnly(t)}
		ctx := ctxTimeout(t, 20*time.Second)

		// Deadlines: every Read has one a few microseconds away, so many time out, some
		// before their operation reaches the engine. The bytes must still arrive in order.
		c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var got []byte
		var timeouts int
		buf := make([]byte, 64)
		for i := 0; len(got) < streamLen && ctx.Err() == nil; i++ {
			c.SetReadDeadline(time.Now().Add(time.Duration(i%8) * 20 * time.Microsecond))
			n, err := c.Read(buf)
			got = append(got, buf[:n]...)
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				timeouts++
			case err != nil:
				t.Fatalf("Read after %d bytes: %v", len(got), err)
			}
		}
		if !bytes.Equal(got, stream) {
			t.Fatalf("received %d bytes (%d Reads timed out), not the %d sent in order", len(got), timeouts, streamLen)
		}
		t.Logf("%d bytes through %d timed-out Reads", len(got), timeouts)

		// Close: each Read is racing its connection's Close; both must return.
		for i := range 100 {
			c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			readErr := make(chan error, 1)
			go func() { _, err := c.Read(make([]byte, 16)); readErr <- err }()
			if i%2 == 0 {
				runtime.Gosched()
			}
			closed := make(chan error, 1)
			go func() { closed <- c.Close() }()
			for _, ch := range []chan error{readErr, closed} {
				select {
				case err := <-ch:
					if err != nil && !errors.Is(err, net.ErrClosed) {
						t.Fatalf("round %d: %v", i, err)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("round %d: Read or Close still blocked after 5s: %s", i, reactorState(r))
				}
			}
		}
	})
}
