package pipeline

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/lookup"
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
