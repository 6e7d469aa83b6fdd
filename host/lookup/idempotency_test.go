package lookup

import (
	"context"
	"net/http"
	"sync"
	"testing"
)

// TestIdempotencyKey: under WithIdempotencyKey, POST and PATCH carry the key, on every
// attempt of a retried call; GET does not; a key the guest set itself wins.
func TestIdempotencyKey(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	first := true
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, r.Method+" "+r.Header.Get("Idempotency-Key"))
		if r.URL.Path == "/flaky" && first {
			first = false
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok"))
	})
	cfg := testConfig(srv.URL)
	cfg.Retry.RetryNonIdempotent = true
	e := open(t, testRegistry(t), "t", cfg)
	ctx := WithIdempotencyKey(context.Background(), "k1")
	wantStatus(t, do(t, e, ctx, "POST /flaky\n\nbody"), 200, "ok")
	wantStatus(t, do(t, e, ctx, "PATCH /x\n\nbody"), 200, "ok")
	wantStatus(t, do(t, e, ctx, "GET /x\n\n"), 200, "ok")
	wantStatus(t, do(t, e, ctx, "POST /x\nIdempotency-Key: mine\n\nbody"), 200, "ok")
	wantStatus(t, do(t, e, context.Background(), "POST /x\n\nbody"), 200, "ok")
	mu.Lock()
	defer mu.Unlock()
	want := []string{"POST k1", "POST k1", "PATCH k1", "GET ", "POST mine", "POST "}
	if len(seen) != len(want) {
		t.Fatalf("requests %q, want %q", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("requests %q, want %q", seen, want)
		}
	}
}
