// Package tests holds end-to-end tests of the clink-wasm CLI: they build the real binary and run
// it as a user would.
package tests

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	bin  string // the built clink-wasm
	root string // repository root
)

func TestMain(m *testing.M) {
	_, file, _, _ := runtime.Caller(0)
	root = filepath.Dir(filepath.Dir(file))
	dir, err := os.MkdirTemp("", "clink-wasm-cli")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "clink-wasm")
	build := exec.Command("go", "build", "-o", bin, "./cmd/clink-wasm")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building clink-wasm: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	code           int
	stdout, stderr string
}

func clink(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = root
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir(),
		// Tests talk to loopback only: never let the AWS credential chain try EC2 IMDS.
		"AWS_EC2_METADATA_DISABLED=true")
	if len(args) > 0 && args[0] == "run" && !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--state") }) {
		args = append(args, "--state", "file://"+t.TempDir())
		cmd.Args = append([]string{bin}, args...)
	}
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	r := result{stdout: so.String(), stderr: se.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running clink-wasm: %v", err)
	}
	// Whatever happens, a user never sees a Go panic trace.
	for _, bad := range []string{"panic:", "goroutine ", "runtime/debug", ".go:"} {
		if strings.Contains(r.stderr, bad) && !strings.Contains(r.stderr, "guest said") {
			t.Errorf("stderr shows a Go trace (%q):\n%s", bad, r.stderr)
		}
	}
	return r
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const abiFixtures = "host/abi/testdata/"

// TestExamples runs every example in both SDK languages through the CLI and compares with its
// expected output.
func TestExamples(t *testing.T) {
	for _, ex := range []struct{ name, key string }{{"counter", "user"}, {"aggregate", "user"}, {"dedup", "user"}} {
		for _, lang := range []string{"as", "go"} {
			t.Run(ex.name+"-"+lang, func(t *testing.T) {
				dir := filepath.Join("examples/wasm", ex.name)
				key := ex.key
				if b, err := os.ReadFile(filepath.Join(root, dir, "KEY")); err == nil {
					key = strings.TrimSpace(string(b))
				}
				r := clink(t, "", "run", "--module", filepath.Join(dir, ex.name+"-"+lang+".wasm"),
					"--input", filepath.Join(dir, "input.jsonl"), "--key", key)
				if r.code != 0 {
					t.Fatalf("exit %d: %s", r.code, r.stderr)
				}
				want, err := os.ReadFile(filepath.Join(root, dir, "expected.jsonl"))
				if err != nil {
					t.Fatal(err)
				}
				if r.stdout != string(want) {
					t.Errorf("output differs from %s/expected.jsonl\n got: %.400s\nwant: %.400s", dir, r.stdout, want)
				}
				if !strings.Contains(r.stderr, "records in") || !strings.Contains(r.stderr, "records/s") {
					t.Errorf("no summary on stderr: %q", r.stderr)
				}
			})
		}
	}
}

func TestRunCSV(t *testing.T) {
	in := writeFile(t, "in.csv", "user,amount\nann,3\nbob,x\nann,4\n")
	r := clink(t, "", "run", "--module", abiFixtures+"counter.wasm", "--input", in, "--key", "user", "--quiet")
	if r.code != 0 || r.stdout != "{\"count\":1}\n{\"count\":1}\n{\"count\":2}\n" {
		t.Fatalf("exit %d, out %q, err %q", r.code, r.stdout, r.stderr)
	}
}

func TestInspect(t *testing.T) {
	r := clink(t, "", "inspect", abiFixtures+"probe.wasm")
	for _, w := range []string{"abi:        v1", "operator:   probe", "states:     s0, s1", "endpoints:  ep",
		"clink_v1.get_async(i32, i32, i32, i32, i32) -> (i32)", "clink_process(i32, i32, i64) -> (i32)", "status:     usable"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("inspect output lacks %q:\n%s", w, r.stdout)
		}
	}
	if r.code != 0 {
		t.Fatalf("exit %d", r.code)
	}
	r = clink(t, "", "inspect", "--json", abiFixtures+"abiv2.wasm")
	if r.code != 1 || !strings.Contains(r.stdout, `"usable": false`) || !strings.Contains(r.stdout, "targets clink ABI v2") {
		t.Fatalf("exit %d: %s", r.code, r.stdout)
	}
}

// TestBadInput covers each bad input of the foundation issue: a clear message and a non-zero
// exit, never a Go panic trace (checked in clink()).
func TestBadInput(t *testing.T) {
	good := writeFile(t, "in.jsonl", "{\"user\":\"a\",\"n\":1}\n{\"user\":\"b\",\"n\":2}\n{\"user\":\"a\",\"n\":3}\n")
	notWasm := writeFile(t, "x.wasm", "this is not wasm")
	cases := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"not wasm", []string{"run", "--module", notWasm, "--input", good}, 1,
			[]string{"not a WebAssembly module"}},
		{"other abi version", []string{"run", "--module", abiFixtures + "abiv2.wasm", "--input", good}, 1,
			[]string{"targets clink ABI v2", "supports v1"}},
		{"missing exports", []string{"run", "--module", abiFixtures + "noexports.wasm", "--input", good}, 1,
			[]string{"missing export clink_process"}},
		{"wasi sockets", []string{"run", "--module", abiFixtures + "sock.wasm", "--input", good}, 1,
			[]string{"sock_accept", "sockets are not available"}},
		{"unknown import", []string{"run", "--module", abiFixtures + "envimport.wasm", "--input", good}, 1,
			[]string{"env.abort, which the host does not provide"}},
		{"trap", []string{"run", "--module", abiFixtures + "trap.wasm", "--input", good, "--key", "user"}, 1,
			[]string{`operator "trapper" failed at input line 1`, `key "a"`, "unreachable", `guest said: "negative amount"`}},
		{"infinite loop", []string{"run", "--module", abiFixtures + "loop.wasm", "--input", good, "--call-timeout", "200ms"}, 1,
			[]string{`operator "spinner" failed at input line 1`, "exceeded its time limit", "200ms"}},
		{"memory bomb", []string{"run", "--module", abiFixtures + "membomb.wasm", "--input", good, "--max-memory-pages", "64"}, 1,
			[]string{`operator "membomb" failed at input line 1`, "ran out of memory", "of a 4096 KiB limit"}},
		{"garbage output", []string{"run", "--module", abiFixtures + "garbage.wasm", "--input", good, "--key", "user"}, 1,
			[]string{`operator "garbage" emitted an invalid value at input line 1`, "not valid JSON"}},
		{"missing module file", []string{"run", "--module", "nope.wasm", "--input", good}, 1,
			[]string{"reading module", "no such file"}},
		{"missing flags", []string{"run", "--input", good}, 2,
			[]string{"--module and --input are required"}},
		{"bad policy", []string{"run", "--module", abiFixtures + "counter.wasm", "--input", good, "--on-malformed", "ignore"}, 2,
			[]string{"--on-malformed must be fail or skip"}},
		{"unknown command", []string{"frobnicate"}, 2, []string{`unknown command "frobnicate"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := clink(t, "", tc.args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d\n%s", r.code, tc.code, r.stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
		})
	}
}

func TestMalformedLines(t *testing.T) {
	in := writeFile(t, "in.jsonl", "{\"user\":\"a\"}\n{\"user\":\n[1,2]\n{\"name\":\"no key\"}\n\n{\"user\":\"a\"}\n")
	// Default: fail at the first malformed line, naming it; the records before it are processed.
	r := clink(t, "", "run", "--module", abiFixtures+"counter.wasm", "--input", in, "--key", "user")
	if r.code != 1 || !strings.Contains(r.stderr, "input line 2: invalid JSON") || r.stdout != "{\"count\":1}\n" {
		t.Fatalf("fail policy: exit %d, out %q, err %s", r.code, r.stdout, r.stderr)
	}
	// Skip: every bad line goes to the dead-letter file with its line number and reason.
	dl := filepath.Join(t.TempDir(), "dead.jsonl")
	r = clink(t, "", "run", "--module", abiFixtures+"counter.wasm", "--input", in, "--key", "user",
		"--on-malformed", "skip", "--dead-letter", dl)
	if r.code != 0 || r.stdout != "{\"count\":1}\n{\"count\":2}\n" || !strings.Contains(r.stderr, "3 malformed skipped") {
		t.Fatalf("skip policy: exit %d, out %q, err %s", r.code, r.stdout, r.stderr)
	}
	dead, _ := os.ReadFile(dl)
	for _, w := range []string{`"line":2`, `"line":3`, "a record must be a JSON object", `"line":4`, `no \"user\" field`} {
		if !strings.Contains(string(dead), w) {
			t.Errorf("dead letters lack %q:\n%s", w, dead)
		}
	}
}

func TestStdinAndOutputFile(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.jsonl")
	r := clink(t, "{\"k\":1}\n{\"k\":1}\n", "run", "--module", abiFixtures+"counter.wasm", "--input", "-", "--key", "k", "--output", out)
	b, _ := os.ReadFile(out)
	if r.code != 0 || string(b) != "{\"count\":1}\n{\"count\":2}\n" {
		t.Fatalf("exit %d, out %q, err %s", r.code, b, r.stderr)
	}
}

func TestManifestEmbed(t *testing.T) {
	// Strip-and-embed round trip: the counter takes its manifest from an export; embedding one
	// makes inspect read it from the custom section instead.
	src, _ := os.ReadFile(filepath.Join(root, abiFixtures+"counter.wasm"))
	mod := writeFile(t, "c.wasm", string(src))
	man := writeFile(t, "m.json", `{"abi":1,"name":"counter2","states":["count"]}`)
	if r := clink(t, "", "manifest", "embed", "--manifest", man, mod); r.code != 0 {
		t.Fatalf("embed: %s", r.stderr)
	}
	r := clink(t, "", "inspect", mod)
	if !strings.Contains(r.stdout, "operator:   counter2") || !strings.Contains(r.stdout, "custom section") {
		t.Fatalf("inspect after embed:\n%s", r.stdout)
	}
	bad := writeFile(t, "bad.json", `{"abi":1,"name":"has space"}`)
	if r := clink(t, "", "manifest", "embed", "--manifest", bad, mod); r.code != 1 || !strings.Contains(r.stderr, "is invalid") {
		t.Fatalf("bad manifest: exit %d %s", r.code, r.stderr)
	}
}

// TestDurableStateRestore: a run commits a final checkpoint to the file pool; a second run with
// --restore latest continues from it (the same input file: nothing left to read; another file:
// from its start, on the restored state); an unknown checkpoint is a clear error.
func TestDurableStateRestore(t *testing.T) {
	pool := "file://" + t.TempDir()
	in := writeFile(t, "in.jsonl", "{\"u\":\"a\"}\n{\"u\":\"b\"}\n{\"u\":\"a\"}\n")
	day2 := writeFile(t, "day2.jsonl", "{\"u\":\"a\"}\n{\"u\":\"b\"}\n{\"u\":\"a\"}\n")
	base := []string{"run", "--module", abiFixtures + "counter.wasm", "--key", "u", "--state", pool}
	args := append(append([]string{}, base...), "--input", in)
	committed := regexp.MustCompile(`checkpoint (\d+) committed`)
	id := func(what string, r result) uint64 {
		t.Helper()
		m := committed.FindStringSubmatch(r.stderr)
		if m == nil {
			t.Fatalf("%s: no committed checkpoint in: %s", what, r.stderr)
		}
		n, _ := strconv.ParseUint(m[1], 10, 64)
		return n
	}
	r := clink(t, "", args...)
	if r.code != 0 || r.stdout != "{\"count\":1}\n{\"count\":1}\n{\"count\":2}\n" {
		t.Fatalf("first run: exit %d, out %q, err %s", r.code, r.stdout, r.stderr)
	}
	first := id("first run", r)
	// The same file again: the checkpoint covers all of it, so nothing is read twice.
	r = clink(t, "", append(args, "--restore", "latest")...)
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "0 records in") {
		t.Fatalf("restored run, same file: exit %d, out %q, err %s", r.code, r.stdout, r.stderr)
	}
	second := id("restored run, same file", r)
	// Another file is read from its start on top of the restored counts.
	r = clink(t, "", append(append(append([]string{}, base...), "--input", day2), "--restore", "latest")...)
	if r.code != 0 || r.stdout != "{\"count\":3}\n{\"count\":2}\n{\"count\":4}\n" {
		t.Fatalf("restored run, day2: exit %d, out %q, err %s", r.code, r.stdout, r.stderr)
	}
	third := id("restored run, day2", r)
	// Without --restore a run starts empty, and its checkpoint ids go on after the old ones.
	r = clink(t, "", args...)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "{\"count\":1}") {
		t.Fatalf("fresh run: exit %d, out %q, err %s", r.code, r.stdout, r.stderr)
	}
	if fourth := id("fresh run", r); !(first < second && second < third && third < fourth) {
		t.Fatalf("checkpoint ids %d, %d, %d, %d do not increase", first, second, third, fourth)
	}
	r = clink(t, "", append(args, "--restore", "42")...)
	if r.code != 1 || !strings.Contains(r.stderr, "checkpoint 42") {
		t.Fatalf("unknown checkpoint: exit %d: %s", r.code, r.stderr)
	}
	r = clink(t, "", append(args, "--restore", "yesterday")...)
	if r.code != 2 || !strings.Contains(r.stderr, "want none, latest, latest-if-any or a checkpoint id") {
		t.Fatalf("bad --restore: exit %d: %s", r.code, r.stderr)
	}
}

// TestUnreachableS3: an S3 pool nobody listens on (loopback port 1) fails the run with a clear
// message, and credentials in the pool URL (userinfo, or the endpoint's) never reach stderr.
func TestUnreachableS3(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "envsecretkey")
	t.Setenv("AWS_REGION", "us-east-1")
	in := writeFile(t, "in.jsonl", "{\"u\":\"a\"}\n")
	for _, pool := range []string{
		"s3://bucket/prefix?endpoint=http://127.0.0.1:1&path_style=true&max_attempts=3",
		"s3://bucket/prefix?endpoint=http://user:hunter22pass@127.0.0.1:1&path_style=true&max_attempts=3",
		"s3://AKIDURL:urlsecretkey@bucket/prefix?endpoint=http://127.0.0.1:1&path_style=true&max_attempts=3",
	} {
		r := clink(t, "", "run", "--module", abiFixtures+"counter.wasm", "--input", in, "--key", "u", "--state", pool)
		if r.code != 1 || !strings.Contains(r.stderr, "state pool s3://") || !strings.Contains(r.stderr, "bucket/prefix") || !strings.Contains(r.stderr, "connection refused") {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		for _, secret := range []string{"hunter22pass", "urlsecretkey", "envsecretkey"} {
			if strings.Contains(r.stderr, secret) {
				t.Errorf("stderr shows a secret (%s): %s", secret, r.stderr)
			}
		}
	}
}

// TestS3State runs the counter twice against the loopback S3 server (versitygw), restoring the
// second run from the first one's final checkpoint.
func TestS3State(t *testing.T) {
	ep, bucket := os.Getenv("CLINK_TEST_S3_ENDPOINT"), os.Getenv("CLINK_TEST_S3_BUCKET")
	if ep == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CLINK_TEST_S3_ENDPOINT is not set: CI must start the S3 server (scripts/s3-up.sh)")
		}
		t.Skip("no S3 server: run under scripts/with-s3.sh or make test")
	}
	pool := fmt.Sprintf("s3://%s/cli-%d?endpoint=%s&path_style=true", bucket, time.Now().UnixNano(), ep)
	in := writeFile(t, "in.jsonl", "{\"u\":\"a\"}\n{\"u\":\"a\"}\n")
	args := []string{"run", "--module", abiFixtures + "counter.wasm", "--input", in, "--key", "u", "--state", pool}
	// Nothing to restore yet: a failure that names the job and the pool, not an empty start.
	if r := clink(t, "", append(args, "--restore", "latest")...); r.code != 1 || r.stdout != "" ||
		!strings.Contains(r.stderr, `no checkpoint of job "counter" in s3://`+bucket+"/cli-") {
		t.Fatalf("restore with nothing: exit %d, out %q, err %s", r.code, r.stdout, r.stderr)
	}
	if r := clink(t, "", args...); r.code != 0 || r.stdout != "{\"count\":1}\n{\"count\":2}\n" {
		t.Fatalf("first run: exit %d, out %q, err %s", r.code, r.stdout, r.stderr)
	}
	// A second file, read from its start on the restored state (the first file's checkpoint
	// covers all of it).
	day2 := writeFile(t, "day2.jsonl", "{\"u\":\"a\"}\n{\"u\":\"a\"}\n")
	args2 := []string{"run", "--module", abiFixtures + "counter.wasm", "--input", day2, "--key", "u", "--state", pool, "--restore", "latest"}
	if r := clink(t, "", args2...); r.code != 0 || r.stdout != "{\"count\":3}\n{\"count\":4}\n" {
		t.Fatalf("restored run: exit %d, out %q, err %s", r.code, r.stdout, r.stderr)
	}
}

// TestCSVMalformed: a bare or unterminated quote, or an empty .csv file, never crashes the host
// (issue 9): a malformed row is a malformed record, an empty file is zero records.
func TestCSVMalformed(t *testing.T) {
	bad := writeFile(t, "bad.csv", "user,n\nann,1\nb\"ob,2\nann,3\n\"carl,4\n")
	dl := filepath.Join(t.TempDir(), "dead.jsonl")
	r := clink(t, "", "run", "--module", abiFixtures+"counter.wasm", "--input", bad, "--key", "user",
		"--on-malformed", "skip", "--dead-letter", dl)
	if r.code != 0 || r.stdout != "{\"count\":1}\n{\"count\":2}\n" || !strings.Contains(r.stderr, "2 malformed skipped") {
		t.Fatalf("skip: exit %d, out %q, err %s", r.code, r.stdout, r.stderr)
	}
	dead, _ := os.ReadFile(dl)
	if want := "{\"line\":3,\"reason\":\"bare \\\" in non-quoted-field\",\"raw\":\"b\\\"ob,2\"}\n" +
		"{\"line\":5,\"reason\":\"extraneous or missing \\\" in quoted-field\",\"raw\":\"\\\"carl,4\"}\n"; string(dead) != want {
		t.Errorf("dead letters\n%s\nwant\n%s", dead, want)
	}
	r = clink(t, "", "run", "--module", abiFixtures+"counter.wasm", "--input", bad, "--key", "user")
	if r.code != 1 || r.stdout != "{\"count\":1}\n" || !strings.Contains(r.stderr, "input line 3: bare \" in non-quoted-field") {
		t.Fatalf("fail: exit %d, out %q, err %s", r.code, r.stdout, r.stderr)
	}
	empty := writeFile(t, "empty.csv", "")
	r = clink(t, "", "run", "--module", abiFixtures+"counter.wasm", "--input", empty, "--key", "user")
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "0 records in, 0 out") {
		t.Fatalf("empty: exit %d, out %q, err %s", r.code, r.stdout, r.stderr)
	}
}
