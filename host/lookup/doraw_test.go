package lookup

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// doRaw runs one DoRaw synchronously and overwrites raw as soon as DoRaw returns: the bytes
// are the caller's again then (the scheduler hands DoRaw a view of guest memory).
func doRaw(t testing.TB, e *Endpoint, raw string) Response {
	t.Helper()
	b := []byte(raw)
	ch := make(chan Response, 1)
	e.DoRaw(context.Background(), b, func(r Response) { ch <- r })
	for i := range b {
		b[i] = 'x'
	}
	return awaitResponse(t, ch, raw)
}

// TestDoRaw: requests parsed in place over DoRaw's copy arrive intact although the caller
// reuses its bytes at once, and so do their responses: small and large, with headers and
// bodies, cached and not.
func TestDoRaw(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		n := len(r.URL.Query().Get("pad")) // a response as long as the pad asks
		fmt.Fprintf(w, "%s %s %s %s|%s", r.Method, r.URL.Path, r.Header.Get("X-A"), b, strings.Repeat("r", n))
	})
	for _, cached := range []bool{false, true} {
		cfg := testConfig(s.URL)
		if cached {
			cfg.Cache = &CacheConfig{TTL: Duration(time.Minute), MaxEntries: 64}
		}
		e := open(t, testRegistry(t), "t1", cfg)
		for _, n := range []int{0, 10, 200, 400, 2000} {
			pad := strings.Repeat("p", n)
			for _, raw := range []string{
				"GET /a" + pad + "?pad=" + pad,
				"GET /b?pad=" + pad + "\nX-A: " + pad + "\n",
				"POST /c?pad=" + pad + "\nX-A: 1\n\n" + pad,
			} {
				method, rest, _ := strings.Cut(raw, " ")
				path, _, _ := strings.Cut(rest, "?")
				xa, body := "", ""
				if _, hs, ok := strings.Cut(raw, "\n"); ok {
					h, b, _ := strings.Cut(hs, "\n")
					xa = strings.TrimPrefix(h, "X-A: ")
					body = strings.TrimPrefix(b, "\n")
				}
				want := fmt.Sprintf("%s %s %s %s|%s", method, path, xa, body, strings.Repeat("r", n))
				for range 2 { // the second GET is a cache hit when cached
					r := doRaw(t, e, raw)
					wantStatus(t, r, 200, want)
				}
			}
		}
	}
}

// TestDoRawShared: DoRaw requests that single-flight joins share one upstream call, and
// different ones do not, although each caller reuses its bytes at once.
func TestDoRawShared(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		io.WriteString(w, r.URL.Path)
	})
	e := open(t, testRegistry(t), "t1", testConfig(s.URL))
	const n = 20
	var wg sync.WaitGroup
	got := make([][]Response, 2)
	var mu sync.Mutex
	for i := range 2 * n {
		wg.Add(1)
		raw := []byte(fmt.Sprintf("GET /k%d", i%2))
		e.DoRaw(context.Background(), raw, func(r Response) {
			mu.Lock()
			got[i%2] = append(got[i%2], r)
			mu.Unlock()
			wg.Done()
		})
		copy(raw, bytes.Repeat([]byte{'x'}, len(raw)))
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.Metrics().SharedCalls < 2*n-2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	for k, rs := range got {
		for _, r := range rs {
			wantStatus(t, r, 200, fmt.Sprintf("/k%d", k))
		}
	}
	if h := s.total(); h != 2 {
		t.Fatalf("%d requests over 2 keys made %d upstream calls, want 2", 2*n, h)
	}
}
