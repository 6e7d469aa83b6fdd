package h2

import (
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/attempt"
)

// killingProxy forwards 127.0.0.1 connections to target and cuts each of the first maxKills
// after a random 5-40 ms: connections die with streams in flight, in the middle of frames.
// Later connections live until their client closes them, so that every retried request
// succeeds in the end however slow the machine is.
func killingProxy(t *testing.T, target string, maxKills int64) (addr string, kills *atomic.Int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	kills = new(atomic.Int64)
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			life := time.Duration(5+rand.IntN(35)) * time.Millisecond
			kill := kills.Add(1) <= maxKills
			if !kill {
				kills.Add(-1)
			}
			wg.Go(func() {
				if !kill {
					// Until either side closes: the client's Close ends the first copy,
					// which closes the upstream side and so ends the second.
					go func() { io.Copy(u, c); u.Close() }()
					io.Copy(c, u)
					c.Close()
					u.Close()
					return
				}
				go io.Copy(u, c)
				go io.Copy(c, u)
				time.Sleep(life)
				c.(*net.TCPConn).SetLinger(0) // a reset, not a clean close
				c.Close()
				u.Close()
			})
		}
	})
	return ln.Addr().String(), kills
}

// TestConnectionKills: 2000 exchanges, 128 at a time, through a proxy that keeps killing
// connections. Every Start gets exactly one completion; a failure is an error, never a
// wrong response; retried, every request gets its own answer; nothing is left running
// after Close.
func TestConnectionKills(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run")
	}
	before := runtime.NumGoroutine()
	srv, _ := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		io.WriteString(w, r.URL.Path)
	}), nil)
	const total, inflight, maxKills = 2000, 128, 300
	const tries = maxKills + 1 // each failed try is a connection killed under it
	addr, kills := killingProxy(t, srv.Listener.Addr().String(), maxKills)
	tr := &Transport{Dial: loopbackDial(t), MaxStreamsPerConn: 16}
	var wg sync.WaitGroup
	sem := make(chan struct{}, inflight)
	var failures, wrong, lost atomic.Int64
	for i := range total {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			path := "/r/" + strconv.Itoa(i)
			for range tries {
				var a attempt.Attempt
				a.Reset(time.Now().Add(10 * time.Second))
				req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
				var calls atomic.Int64
				ch := make(chan result, 2)
				tr.Start(req, &a, func(resp *http.Response, err error) {
					calls.Add(1)
					r := result{resp: resp, err: err}
					if err == nil {
						r.body, r.err = io.ReadAll(resp.Body)
					}
					ch <- r
				})
				var r result
				select {
				case r = <-ch:
				case <-time.After(20 * time.Second): // past the deadline: a lost completion
					lost.Add(1)
					return
				}
				time.Sleep(time.Millisecond) // a second completion would show by now
				if calls.Load() != 1 {
					t.Errorf("%s: %d completions", path, calls.Load())
				}
				if r.err != nil {
					failures.Add(1)
					continue
				}
				if string(r.body) != path {
					wrong.Add(1)
				}
				return
			}
			t.Errorf("%s: no success in %d tries", path, tries)
		}()
	}
	wg.Wait()
	tr.Close()
	t.Logf("%d connections killed, %d failed attempts (retried)", kills.Load(), failures.Load())
	if wrong.Load() > 0 || lost.Load() > 0 {
		t.Fatalf("%d wrong responses, %d exchanges never completed", wrong.Load(), lost.Load())
	}
	if kills.Load() < 5 {
		t.Fatalf("only %d connections killed: the test did not test anything", kills.Load())
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before+8 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+8 {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines after Close (before: %d)\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}
