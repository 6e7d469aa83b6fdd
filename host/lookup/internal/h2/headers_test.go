package h2

import (
	"net/http"
	"testing"
	"time"
)

// TestHeadersFor: a response whose status HeadersFor rejects has no Header, yet its
// content-length is still read and checked; the others keep every field.
func TestHeadersFor(t *testing.T) {
	srv, _ := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Extra", "1")
		if r.URL.Path == "/redirect" {
			w.Header().Set("Location", "/elsewhere")
			w.WriteHeader(http.StatusFound)
			return
		}
		w.Write([]byte("hello"))
	}), nil)
	tr := newTransport(t)
	tr.HeadersFor = func(status int) bool { return status/100 == 3 }
	r := do(tr, get(t, srv.URL, "/plain"), 5*time.Second)
	if r.err != nil || string(r.body) != "hello" {
		t.Fatalf("got %v %q", r.err, r.body)
	}
	if r.resp.Header != nil || r.resp.ContentLength != 5 {
		t.Fatalf("200: header %v, content length %d: want none and 5", r.resp.Header, r.resp.ContentLength)
	}
	r = do(tr, get(t, srv.URL, "/redirect"), 5*time.Second)
	if r.err != nil || r.resp.StatusCode != http.StatusFound {
		t.Fatalf("got %v", r.err)
	}
	if r.resp.Header.Get("Location") != "/elsewhere" || r.resp.Header.Get("X-Extra") != "1" {
		t.Fatalf("302: header %v", r.resp.Header)
	}
}
