package lookup

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestHammer drives one endpoint with concurrent requests that share calls, get cancelled at
// random moments, time out, retry after resets and 503s, hit the cache and wait in the
// queue, then closes it mid-stream. Every done must run exactly once, and nothing of the
// package may be left running. Not parallel: it checks goroutines process-wide.
func TestHammer(t *testing.T) {
	var n atomic.Int64
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch x := n.Add(1) % 7; x {
		case 0:
			hijackClose(w)
		case 1:
			http.Error(w, "busy", http.StatusServiceUnavailable)
		case 2:
			time.Sleep(30 * time.Millisecond)
			io.WriteString(w, "slow")
		default:
			time.Sleep(time.Duration(x) * time.Millisecond)
			io.WriteString(w, r.URL.Path)
		}
	})
	cfg := testConfig(s.URL)
	cfg.MaxInFlight = 8
	cfg.MaxQueued = 64
	cfg.Timeout = Duration(20 * time.Millisecond)
	cfg.Cache = &CacheConfig{TTL: Duration(5 * time.Millisecond)}
	cfg.Concurrency.Algorithm = "aimd"
	cfg.Breaker.ConsecutiveFailures = 1000 // keep it closed: exercise the other paths
	e, err := testRegistry(t).Open("t1", cfg)
	if err != nil {
		t.Fatal(err)
	}

	const workers, each = 16, 150
	var calls [workers * each]atomic.Int32
	var outcomes sync.Map
	var wg sync.WaitGroup
	stopAt := time.Now().Add(10 * time.Second)
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := 0; i < each && time.Now().Before(stopAt); i++ {
				id := g*each + i
				method := []string{"GET", "GET", "GET", "POST", "PUT"}[rng.IntN(5)]
				raw := fmt.Sprintf("%s /p%d", method, rng.IntN(4))
				req, _ := ParseRequest([]byte(raw))
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(3) == 0 {
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rng.IntN(40))*time.Millisecond)
				}
				got := make(chan struct{})
				e.Do(ctx, req, func(r Response) {
					if calls[id].Add(1) != 1 {
						t.Errorf("request %d: done called twice", id)
					}
					k := fmt.Sprintf("%v/%d", Kind(r.Err), r.Status)
					v, _ := outcomes.LoadOrStore(k, new(atomic.Int64))
					v.(*atomic.Int64).Add(1)
					close(got)
				})
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
					cancel()
				}
				if rng.IntN(2) == 0 {
					<-got
				}
				defer cancel()
			}
		}()
	}
	wg.Wait()
	e.Close()
	var missing int
	for i := range calls {
		if calls[i].Load() == 0 {
			missing++
		}
	}
	// Requests not issued because of the time bound are not missing; count issued ones.
	var issued int64
	outcomes.Range(func(k, v any) bool {
		issued += v.(*atomic.Int64).Load()
		t.Logf("%-20s %d", k, v.(*atomic.Int64).Load())
		return true
	})
	if int(issued)+missing != len(calls) {
		t.Fatalf("issued %d + never called %d != %d", issued, missing, len(calls))
	}
	m := e.Metrics()
	if m.Requests != uint64(issued) {
		t.Fatalf("metrics count %d requests, %d done calls", m.Requests, issued)
	}
	t.Logf("requests %d attempts %d retries %d shared %d cache hits %d limit %d", m.Requests, m.Attempts, m.Retries, m.SharedCalls, m.CacheHits, m.Limit)
	deadline := time.Now().Add(2 * time.Second)
	for packageGoroutines() != "" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if g := packageGoroutines(); g != "" {
		t.Fatalf("goroutines left after Close:\n%s", g)
	}
}
