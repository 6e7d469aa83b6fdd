package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A stand-in server that records what the client sent and answers like the real one.
func fakeAPI(t *testing.T, status int, body string) (*httptest.Server, *http.Request) {
	t.Helper()
	got := &http.Request{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*got = *r.Clone(context.Background())
		if status >= 300 {
			w.Header().Set("Content-Type", "application/problem+json")
		}
		w.WriteHeader(status)
		w.Write([]byte(body))
	}))
	t.Cleanup(ts.Close)
	return ts, got
}

func runClient(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

func TestClientPrecedence(t *testing.T) {
	flagSrv, flagReq := fakeAPI(t, 200, `{"items":[]}`)
	envSrv, envReq := fakeAPI(t, 200, `{"items":[]}`)
	fileSrv, fileReq := fakeAPI(t, 200, `{"items":[]}`)
	cfg := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(cfg, []byte(`{"server":"`+fileSrv.URL+`","token":"file-token"}`), 0o600)
	t.Setenv("CLINK_CONFIG", cfg)

	// The config file alone.
	t.Setenv("CLINK_SERVER", "")
	t.Setenv("CLINK_TOKEN", "")
	if code, _, stderr := runClient(t, "module", "ls"); code != 0 || fileReq.Header.Get("Authorization") != "Bearer file-token" {
		t.Fatalf("config file: %d %s %q", code, stderr, fileReq.Header.Get("Authorization"))
	}
	// The environment beats the file.
	t.Setenv("CLINK_SERVER", envSrv.URL)
	t.Setenv("CLINK_TOKEN", "env-token")
	if code, _, _ := runClient(t, "module", "ls"); code != 0 || envReq.Header.Get("Authorization") != "Bearer env-token" {
		t.Fatalf("env: %d %q", code, envReq.Header.Get("Authorization"))
	}
	// Flags beat both; a flag token with the env server.
	if code, _, _ := runClient(t, "module", "ls", "--server", flagSrv.URL, "--token", "flag-token", "--tenant", "acme"); code != 0 ||
		flagReq.Header.Get("Authorization") != "Bearer flag-token" || flagReq.URL.Query().Get("tenant") != "acme" {
		t.Fatalf("flags: %d %q %q", code, flagReq.Header.Get("Authorization"), flagReq.URL.RawQuery)
	}
	if code, _, _ := runClient(t, "module", "ls", "--token", "flag-token"); code != 0 || envReq.Header.Get("Authorization") != "Bearer flag-token" {
		t.Fatalf("mixed: %d %q", code, envReq.Header.Get("Authorization"))
	}
}

func TestClientExitCodes(t *testing.T) {
	t.Setenv("CLINK_CONFIG", filepath.Join(t.TempDir(), "none.json"))
	t.Setenv("CLINK_TOKEN", "tok")
	cases := []struct {
		status int
		code   int
	}{{401, exitAuth}, {403, exitAuth}, {404, exitNotFound}, {409, exitConflict}, {422, exitInvalid}, {413, exitInvalid}, {429, exitUnavailable}, {500, exitFailure}}
	for _, c := range cases {
		srv, _ := fakeAPI(t, c.status, `{"type":"urn:clink:problem:x","title":"T","status":0,"code":"some_code","detail":"what went wrong","field":"name"}`)
		t.Setenv("CLINK_SERVER", srv.URL)
		code, _, stderr := runClient(t, "module", "get", "x")
		if code != c.code || !strings.Contains(stderr, "name: what went wrong (some_code)") {
			t.Errorf("HTTP %d: exit %d (%s), want %d", c.status, code, stderr, c.code)
		}
	}
	// No token at all.
	t.Setenv("CLINK_TOKEN", "")
	if code, _, stderr := runClient(t, "module", "ls"); code != exitAuth || !strings.Contains(stderr, "no token") {
		t.Errorf("no token: %d %s", code, stderr)
	}
	// Nothing listening.
	t.Setenv("CLINK_TOKEN", "tok")
	t.Setenv("CLINK_SERVER", "http://127.0.0.1:1")
	if code, _, stderr := runClient(t, "tenant", "ls"); code != exitUnreachable || !strings.Contains(stderr, "cannot reach") {
		t.Errorf("unreachable: %d %s", code, stderr)
	}
	// Usage errors.
	if code, _, _ := runClient(t, "module", "get"); code != exitUsage {
		t.Errorf("missing argument: %d", code)
	}
	if code, _, _ := runClient(t, "tenant", "quota", "a", "--set", "max_pipelines"); code != exitUsage {
		t.Errorf("bad --set: %d", code)
	}
}

func TestCompletion(t *testing.T) {
	code, out, stderr := runClient(t, "completion", "bash")
	if code != 0 || !strings.Contains(out, "__start_clink-wasm") {
		t.Fatalf("completion bash: %d %s", code, stderr)
	}
	// The hidden command the scripts call completes the command names, the flag ones included.
	code, out, _ = runClient(t, "__complete", "")
	for _, c := range []string{"serve", "module", "tenant", "run", "inspect"} {
		if code != 0 || !strings.Contains(out, c) {
			t.Errorf("completion lacks %s: %s", c, out)
		}
	}
	code, out, _ = runClient(t, "__complete", "module", "")
	if code != 0 || !strings.Contains(out, "push") || !strings.Contains(out, "rm") {
		t.Errorf("module completion: %s", out)
	}
}
