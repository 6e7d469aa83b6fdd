package lookup

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"
	"testing/synctest"
)

func watchGroups(e *Endpoint) int {
	e.watches.mu.Lock()
	defer e.watches.mu.Unlock()
	return len(e.watches.groups)
}

// TestSharedContextWatch: the waiters of one context share one watch (one per Done
// channel: a WithValue child shares its parent's); when that context ends, every one of its
// waiters is cancelled and no other; delivered waiters leave no watch behind.
func TestSharedContextWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		mn := newMemNet(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
				io.WriteString(w, "ok")
			case <-r.Context().Done():
			}
		})
		cfg := memConfig()
		cfg.SingleFlight = "off"
		e := open(t, NewRegistry(WithDialer(mn.dial)), "t1", cfg)

		type key struct{}
		a, cancelA := context.WithCancel(context.Background())
		child := context.WithValue(a, key{}, 1)
		other, cancelOther := context.WithCancel(context.Background())
		defer cancelOther()
		results := make(chan Response, 16)
		send := func(ctx context.Context, path string) {
			req, err := ParseRequest([]byte("GET /" + path))
			if err != nil {
				t.Fatal(err)
			}
			e.Do(ctx, req, func(r Response) { results <- r })
		}
		for i := range 10 {
			send(a, "a"+strconv.Itoa(i))
		}
		send(child, "child")
		send(other, "other")
		send(context.Background(), "background") // cannot end: not watched
		synctest.Wait()
		if n := watchGroups(e); n != 2 {
			t.Fatalf("%d watches for two contexts that can end, want 2", n)
		}
		cancelA()
		for range 11 {
			wantKind(t, <-results, KindCancelled)
		}
		synctest.Wait()
		select {
		case r := <-results:
			t.Fatalf("a request of another context ended: %+v", r)
		default:
		}
		if n := watchGroups(e); n != 1 {
			t.Fatalf("%d watches after the first context ended, want 1", n)
		}
		close(release)
		wantStatus(t, <-results, 200, "ok")
		wantStatus(t, <-results, 200, "ok")
		if n := watchGroups(e); n != 0 {
			t.Fatalf("%d watches left after every waiter was delivered", n)
		}
	})
}
