package pipeline

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
)

// TestLookupRefusalNamesRule: a lookup the endpoint's policy refuses reaches the guest as
// LOOKUP_REFUSED, never the upstream, and the run's log names the rule that refused it.
func TestLookupRefusalNamesRule(t *testing.T) {
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Write([]byte(`{}`))
	}))
	defer up.Close()
	// The shorthand allows GET and HEAD only; enrich POSTs every record.
	ep, err := ParseEndpointFlag("svc=" + up.URL)
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	out, _, err := runOpts(t, Options{
		Module: abiFixture(t, "enrich"), KeyField: "u",
		Endpoints: []lookup.EndpointConfig{ep}, Log: &log,
	}, `{"u":"a"}`+"\n"+`{"u":"b"}`+"\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(out, `"lookup_error":19`); got != 2 {
		t.Errorf("want 2 outputs with LOOKUP_REFUSED (19), got %d in:\n%s", got, out)
	}
	if hits.Load() != 0 {
		t.Errorf("a refused lookup reached the upstream %d times", hits.Load())
	}
	if l := log.String(); !strings.Contains(l, "methods") || !strings.Contains(l, "POST") {
		t.Errorf("the log does not name the rule (methods) and the method refused:\n%s", l)
	}
}

// TestLookupRefusalInFailure: a guest that fails after a refused lookup fails its run with a
// message naming operator and record, and the rule that refused the lookup (the guest saw
// only LOOKUP_REFUSED).
func TestLookupRefusalInFailure(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	ep, err := ParseEndpointFlag("svc=" + up.URL)
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join("..", "scheduler", "testdata", "enrichtrap.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	// enrichtrap sends its record's value as the lookup request and returns an error when the
	// lookup fails: a JSON object is no request line, so the endpoint refuses it.
	_, _, err = runOpts(t, Options{Module: mod, Endpoints: []lookup.EndpointConfig{ep}, Order: scheduler.OrderInput},
		`{"u":"a"}`+"\n")
	if err == nil {
		t.Fatal("the run succeeded")
	}
	for _, want := range []string{`operator "enrichtrap"`, "input line 1", "its last lookup failed", "refused by rule"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
}
