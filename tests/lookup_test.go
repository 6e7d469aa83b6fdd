package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

// TestLookupEnrichment runs the enrich guest against a real HTTP server on loopback: each
// record is POSTed to the endpoint and the response becomes the output. Secrets injected by
// the endpoint reach the server but never the guest.
//
// With transport h2c the upstream speaks only HTTP/2 (prior knowledge): every call must
// arrive as HTTP/2.
func TestLookupEnrichment(t *testing.T) {
	for _, transport := range []string{"h1", "h2c"} {
		t.Run(transport, func(t *testing.T) { testLookupEnrichment(t, transport) })
	}
}

func testLookupEnrichment(t *testing.T, transport string) {
	var calls atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if want := map[string]int{"h1": 1, "h2c": 2}[transport]; r.ProtoMajor != want {
			http.Error(w, "wrong protocol "+r.Proto, http.StatusHTTPVersionNotSupported)
			return
		}
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/api/enrich" || r.Method != http.MethodPost {
			http.Error(w, "wrong path", http.StatusNotFound)
			return
		}
		var rec map[string]any
		json.Unmarshal(body, &rec)
		out, _ := json.Marshal(map[string]any{"user": rec["user"], "country": "NZ", "auth": r.Header.Get("Authorization")})
		w.Write(out)
	}))
	if transport == "h2c" {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true) // no HTTP/1.1 at all
		srv.Config.Protocols = &p
	}
	srv.Start()
	defer srv.Close()
	in := writeFile(t, "in.jsonl", "{\"user\":\"a\"}\n{\"user\":\"b\"}\n{\"user\":\"a\"}\n")
	eps := writeFile(t, "eps.json", fmt.Sprintf(`[{"name":"svc","base_url":%q,"methods":["POST"],"transport":%q,
		"headers":{"Authorization":"Bearer ${env:CLINK_TEST_TOKEN}"},"egress":{"allow_loopback":true}}]`, srv.URL+"/api", transport))
	t.Setenv("CLINK_TEST_TOKEN", "s3cret")
	r := clink(t, "", "run", "--module", abiFixtures+"enrich.wasm", "--input", in, "--key", "user", "--endpoints", eps)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	line := func(u string) string { return `{"auth":"Bearer s3cret","country":"NZ","user":"` + u + `"}` }
	// Keyed: records of different keys may finish in any order, so compare sorted lines.
	got := strings.Split(strings.TrimSpace(r.stdout), "\n")
	slices.Sort(got)
	if want := []string{line("a"), line("a"), line("b")}; !slices.Equal(got, want) {
		t.Fatalf("output %q", r.stdout)
	}
	// --order input: exactly input order.
	r = clink(t, "", "run", "--module", abiFixtures+"enrich.wasm", "--input", in, "--order", "input", "--endpoints", eps)
	if want := line("a") + "\n" + line("b") + "\n" + line("a") + "\n"; r.code != 0 || r.stdout != want {
		t.Fatalf("input order: exit %d, out %q: %s", r.code, r.stdout, r.stderr)
	}
	if calls.Load() < 4 {
		t.Errorf("%d upstream calls", calls.Load())
	}
}

// TestLookupUnreachable: an endpoint nobody listens on gives the guest LOOKUP_UNAVAILABLE,
// which this guest turns into output; the run itself succeeds.
func TestLookupUnreachable(t *testing.T) {
	in := writeFile(t, "in.jsonl", "{\"user\":\"a\"}\n")
	eps := writeFile(t, "eps.json", `[{"name":"svc","base_url":"http://127.0.0.1:1/api","methods":["POST"],
		"retry":{"max_attempts":2},"egress":{"allow_loopback":true}}]`)
	r := clink(t, "", "run", "--module", abiFixtures+"enrich.wasm", "--input", in, "--key", "user", "--endpoints", eps)
	if r.code != 0 || r.stdout != "{\"lookup_error\":20}\n" {
		t.Fatalf("exit %d, out %q: %s", r.code, r.stdout, r.stderr)
	}
}

// TestLookupMethodRefused: the --endpoint shorthand allows GET and HEAD only; the guest's POST
// is refused without a request being sent.
func TestLookupMethodRefused(t *testing.T) {
	in := writeFile(t, "in.jsonl", "{\"user\":\"a\"}\n")
	r := clink(t, "", "run", "--module", abiFixtures+"enrich.wasm", "--input", in, "--endpoint", "svc=http://127.0.0.1:1/api")
	if r.code != 0 || r.stdout != "{\"lookup_error\":19}\n" {
		t.Fatalf("exit %d, out %q: %s", r.code, r.stdout, r.stderr)
	}
}

// TestLookupEgressDenied: without an explicit allowance, an endpoint on loopback is refused
// before anything is dialled; the guest sees LOOKUP_REFUSED.
func TestLookupEgressDenied(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer srv.Close()
	in := writeFile(t, "in.jsonl", "{\"user\":\"a\"}\n")
	eps := writeFile(t, "eps.json", fmt.Sprintf(`{"endpoints":[{"name":"svc","base_url":%q,"methods":["POST"]}]}`, srv.URL))
	r := clink(t, "", "run", "--module", abiFixtures+"enrich.wasm", "--input", in, "--key", "user", "--endpoints", eps)
	switch {
	case r.code == 1 && strings.Contains(r.stderr, "loopback"):
		// refused when the endpoint is opened: also fine
	case r.code == 0 && r.stdout == "{\"lookup_error\":19}\n":
	default:
		t.Fatalf("exit %d, out %q: %s", r.code, r.stdout, r.stderr)
	}
	if calls.Load() != 0 {
		t.Fatal("the request reached the server")
	}
}

func TestEndpointMissing(t *testing.T) {
	in := writeFile(t, "in.jsonl", "{\"user\":\"a\"}\n")
	r := clink(t, "", "run", "--module", abiFixtures+"enrich.wasm", "--input", in)
	if r.code != 1 || !strings.Contains(r.stderr, `declares lookup endpoint "svc" but the pipeline defines no such endpoint`) {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte("{not json"), 0o644)
	r = clink(t, "", "run", "--module", abiFixtures+"enrich.wasm", "--input", in, "--endpoints", bad)
	if r.code != 2 || !strings.Contains(r.stderr, "--endpoints") {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
}
