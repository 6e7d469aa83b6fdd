package h1

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// deadlineConn counts the deadlines set on a connection.
type deadlineConn struct {
	net.Conn
	sets atomic.Int32
}

func (c *deadlineConn) SetDeadline(t time.Time) error {
	c.sets.Add(1)
	return c.Conn.SetDeadline(t)
}

// TestKeptDeadline: a reused connection keeps its deadline when it leaves the exchange at
// least half of the exchange's time, so a busy connection does not move a timer per exchange;
// an exchange still running when that earlier deadline passes goes on to its own deadline,
// and fails there. On the fake clock of a synctest bubble, over a pipe.
func TestKeptDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		delays := make(chan time.Duration, 4) // how long the server takes for each request
		var nc *deadlineConn
		served := make(chan struct{}) // the server's goroutine has returned
		dial := func(context.Context, string, string) (net.Conn, error) {
			if nc != nil {
				return nil, errors.New("a second dial: the connection was not reused")
			}
			client, server := net.Pipe()
			nc = &deadlineConn{Conn: client}
			go func() {
				defer close(served)
				defer server.Close()
				br := bufio.NewReader(server)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					time.Sleep(<-delays)
					if _, err := io.WriteString(server, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
						return
					}
				}
			}()
			return nc, nil
		}
		tr := &Transport{Dial: dial}
		defer tr.Close()
		exchange := func(timeout, delay time.Duration) error {
			delays <- delay
			var a Attempt
			a.Reset(time.Now().Add(timeout))
			req, _ := http.NewRequest("GET", "http://127.0.0.1:80/x", nil)
			resp, err := tr.Exchange(req, &a)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil && string(b) != "ok" {
				err = errors.New("body " + string(b))
			}
			return err
		}

		if err := exchange(10*time.Second, 0); err != nil {
			t.Fatalf("first exchange: %v", err)
		}
		if n := nc.sets.Load(); n != 1 {
			t.Fatalf("%d deadlines set for one exchange, want 1", n)
		}
		time.Sleep(time.Second)
		// Its own deadline is at 11s; the connection's, kept, at 10s. The response comes at
		// 10.5s: the kept deadline passes first and moves (one more set), then the exchange
		// ends well.
		start := time.Now()
		if err := exchange(10*time.Second, 9500*time.Millisecond); err != nil {
			t.Fatalf("exchange past the kept deadline: %v", err)
		}
		if n := nc.sets.Load(); n != 2 {
			t.Fatalf("%d deadlines set after the second exchange, want 2 (kept, then moved once)", n)
		}
		if d := time.Since(start); d != 9500*time.Millisecond {
			t.Fatalf("second exchange took %v on the fake clock, want 9.5s", d)
		}
		// A kept deadline never outlasts the exchange's own: an exchange with a shorter
		// timeout sets its own, and fails at it.
		start = time.Now()
		err := exchange(time.Second, 3*time.Second)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("slow exchange: %v, want a deadline error", err)
		}
		if d := time.Since(start); d != time.Second {
			t.Fatalf("slow exchange failed after %v on the fake clock, want its timeout, 1s", d)
		}
		<-served // the failed exchange closed the connection: the server's write fails
	})
}

// TestPeekAfterDeadline: a pooled connection whose deadline (kept from an earlier exchange)
// has passed while it sat idle is still checked for liveness correctly before a request that
// cannot be replayed, and reused: the peek must not fail on the old deadline and close a live
// connection.
func TestPeekAfterDeadline(t *testing.T) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}))
	defer s.Close()
	tr, d := newTransport(t)
	post := func(timeout time.Duration) error {
		var a Attempt
		a.Reset(time.Now().Add(timeout))
		req, _ := http.NewRequest("POST", s.URL+"/x", strings.NewReader("b"))
		resp, err := tr.Exchange(req, &a)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		return err
	}
	if err := post(50 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the connection's deadline passes while it is idle
	if err := post(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d dials for two POSTs on a live keep-alive connection, want 1", n)
	}
}
