package server

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
)

// gatedBody is a request body that blocks its first Read until released.
type gatedBody struct {
	started, release chan struct{}
	once             sync.Once
	r                *bytes.Reader
}

func newGatedBody(b []byte) *gatedBody {
	return &gatedBody{started: make(chan struct{}), release: make(chan struct{}), r: bytes.NewReader(b)}
}

func (g *gatedBody) Read(p []byte) (int, error) {
	g.once.Do(func() { close(g.started); <-g.release })
	return g.r.Read(p)
}

// TestUploadSlotsPerTenant: a tenant with one upload in progress cannot take a second upload
// slot, so another tenant's upload goes through while the first tenant's second one waits.
func TestUploadSlotsPerTenant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t) // two upload slots (the default)
		tokA := e.tenant("a", map[string]any{"api_requests_per_second": 1000})
		tokB := e.tenant("b", nil)
		upload := func(tok string, body *gatedBody, code *int, wg *sync.WaitGroup) {
			defer wg.Done()
			req := httptest.NewRequest("POST", "/api/v1/modules", body)
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/wasm")
			w := httptest.NewRecorder()
			e.http.ServeHTTP(w, req)
			*code = w.Code
		}
		var wg sync.WaitGroup
		var codeA1, codeA2 int
		a1, a2 := newGatedBody(fixture(t, "counter.wasm")), newGatedBody(fixture(t, "fast.wasm"))
		wg.Add(2)
		go upload(tokA, a1, &codeA1, &wg)
		synctest.Wait()
		select {
		case <-a1.started:
		default:
			t.Fatal("a's first upload is not reading its body")
		}
		go upload(tokA, a2, &codeA2, &wg)
		synctest.Wait()
		select {
		case <-a2.started:
			t.Fatal("a's second upload took a second slot")
		default:
		}
		// b is not held up by a.
		if r := e.upload(tokB, "", fixture(t, "counter.wasm")); r.code != http.StatusCreated {
			t.Fatalf("b: %d %s", r.code, r.body)
		}
		close(a1.release)
		close(a2.release)
		wg.Wait()
		if codeA1 != http.StatusCreated || codeA2 != http.StatusCreated {
			t.Fatalf("a's uploads: %d %d", codeA1, codeA2)
		}
	})
}
