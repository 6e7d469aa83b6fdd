package main

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
	"sync"
	"testing"
)

// TestRunRetryThenSucceeds: `run --retries 2 --on-error dead-letter` over host/abi's "flaky"
// module, whose upstream makes chosen records trap on their first attempts (by the request's
// Idempotency-Key, stable across a record's attempts). The records that succeed within three
// attempts are counted once each, in order per key, into --output; the ones that never do go
// to --dead-letter once each with attempts 3; the summary counts the retried calls.
func TestRunRetryThenSucceeds(t *testing.T) {
	var mu sync.Mutex
	attempts := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var v struct {
			K    string
			I    int
			Fail int
		}
		k := r.Header.Get("Idempotency-Key")
		if json.Unmarshal(body, &v) != nil || k == "" {
			http.Error(w, "bad request", 400)
			return
		}
		mu.Lock()
		attempts[k]++
		n := attempts[k]
		mu.Unlock()
		if n <= v.Fail {
			io.WriteString(w, "t")
			return
		}
		fmt.Fprintf(w, `{"k":%q,"i":%d,"count":`, v.K, v.I)
	}))
	defer srv.Close()
	eps := writeTemp(t, "endpoints.json", fmt.Sprintf(`[{"name":"svc","base_url":%q,"methods":["POST"],"egress":{"allow_loopback":true}}]`, srv.URL))

	const n = 120
	var in strings.Builder
	want := map[string][]string{}
	var dead, retried int
	for i := range n {
		fail := 0
		switch {
		case i%13 == 6:
			fail = 99
		case i%7 == 3:
			fail = 1
		case i%11 == 5:
			fail = 2
		}
		fmt.Fprintf(&in, "{\"k\":\"k%d\",\"i\":%d,\"fail\":%d}\n", i%3, i, fail)
		retried += min(fail, 2)
		if fail > 2 {
			dead++
			continue
		}
		k := fmt.Sprintf("k%d", i%3)
		want[k] = append(want[k], fmt.Sprintf(`{"k":%q,"i":%d,"count":%d}`, k, i, len(want[k])+1))
	}
	dir := t.TempDir()
	input, out, dl := writeTemp(t, "in.jsonl", in.String()), filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "dead.jsonl")
	r := runCLI(t, "", "run", "--module", abiTestdata+"flaky.wasm", "--input", input, "--output", out, "--key", "k",
		"--state", "file://"+filepath.Join(dir, "state"), "--endpoints", eps, "--on-error", "dead-letter", "--retries", "2", "--dead-letter", dl)
	if summary := fmt.Sprintf("%d records in, %d out, %d dead-lettered (the module faulted), %d calls retried", n, n-dead, dead, retried); r.code != 0 ||
		!strings.Contains(r.stderr, summary) {
		t.Fatalf("exit %d, want %q in:\n%s", r.code, summary, r.stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		var v struct{ K string }
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("output %q: %v", l, err)
		}
		got[v.K] = append(got[v.K], l)
	}
	for k, w := range want {
		if !slices.Equal(got[k], w) {
			t.Fatalf("key %s: output\n%q\nwant\n%q", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("output keys %v", got)
	}
	b, err = os.ReadFile(dl)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	seen := map[int64]bool{}
	for _, l := range lines {
		var d struct {
			Line     int64
			Operator string
			Attempts int
			Reason   string
		}
		if err := json.Unmarshal([]byte(l), &d); err != nil || seen[d.Line] || (d.Line-1)%13 != 6 || d.Operator != "flaky" || d.Attempts != 3 ||
			!strings.Contains(d.Reason, "told to trap") {
			t.Fatalf("dead letter %q: %v", l, err)
		}
		seen[d.Line] = true
	}
	if len(seen) != dead {
		t.Fatalf("%d dead letters, want %d", len(seen), dead)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != n {
		t.Fatalf("%d idempotency keys, want one per record (%d)", len(attempts), n)
	}
}

// TestRunHostMigration: `run --restore latest` into a module that exports clink_migrate says in
// its summary that the host migrated the state, and how much; a migration that traps fails the
// run (exit 1) naming the operator, the state and the key.
func TestRunHostMigration(t *testing.T) {
	dir := t.TempDir()
	st := "file://" + filepath.Join(dir, "state")
	in1 := writeTemp(t, "in1.jsonl", "{\"u\":\"a\"}\n{\"u\":\"b\"}\n{\"u\":\"a\"}\n")
	if r := runCLI(t, "", "run", "--module", abiTestdata+"migv1.wasm", "--input", in1, "--key", "u", "--state", st); r.code != 0 {
		t.Fatalf("v1: exit %d\n%s", r.code, r.stderr)
	}
	in2 := writeTemp(t, "in2.jsonl", "{\"u\":\"a\"}\n")
	r := runCLI(t, "", "run", "--module", abiTestdata+"migv2.wasm", "--input", in2, "--key", "u", "--state", st, "--restore", "latest")
	if r.code != 0 || r.stdout != "{\"count\":3,\"v\":2}\n" ||
		!strings.Contains(r.stderr, "state version 1 migrated to 2 through the module's clink_migrate (2 values rewritten, 0 dropped)") {
		t.Fatalf("v2: exit %d, out %q\n%s", r.code, r.stdout, r.stderr)
	}
	st = "file://" + filepath.Join(dir, "state2")
	in3 := writeTemp(t, "in3.jsonl", "{\"u\":\"poison\"}\n")
	if r := runCLI(t, "", "run", "--module", abiTestdata+"migv1.wasm", "--input", in3, "--key", "u", "--state", st); r.code != 0 {
		t.Fatalf("v1: exit %d\n%s", r.code, r.stderr)
	}
	r = runCLI(t, "", "run", "--module", abiTestdata+"migv2.wasm", "--input", in3, "--key", "u", "--state", st, "--restore", "latest")
	if r.code != 1 || !strings.Contains(r.stderr, `operator "migcount": migrating checkpoint`) || !strings.Contains(r.stderr, `state "count" from version 1 to 2 failed at key "poison"`) {
		t.Fatalf("poison: exit %d\n%s", r.code, r.stderr)
	}
}
