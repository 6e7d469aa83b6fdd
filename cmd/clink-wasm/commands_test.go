package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const abiTestdata = "../../host/abi/testdata/"

type cliResult struct {
	code           int
	stdout, stderr string
}

// runCLI runs the CLI in process, with the compilation cache off unless the arguments say
// otherwise.
func runCLI(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	if len(args) > 0 && args[0] == "run" {
		args = append(args, "--no-cache")
	}
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return cliResult{code, out.String(), errb.String()}
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTopLevel(t *testing.T) {
	r := runCLI(t, "")
	if r.code != 2 || !strings.Contains(r.stderr, "Usage:") {
		t.Fatalf("no args: %+v", r)
	}
	for _, a := range []string{"help", "-h", "--help"} {
		if r := runCLI(t, "", a); r.code != 0 || !strings.Contains(r.stdout, "clink-wasm manifest embed --manifest MANIFEST.json IN.wasm [-o OUT.wasm]") {
			t.Fatalf("%s: %+v", a, r)
		}
	}
	if r := runCLI(t, "", "version"); r.code != 0 || r.stdout != "clink-wasm dev\n" {
		t.Fatalf("version: %+v", r)
	}
	if r := runCLI(t, "", "frobnicate"); r.code != 2 || !strings.Contains(r.stderr, `unknown command "frobnicate"`) {
		t.Fatalf("unknown: %+v", r)
	}
}

// TestInternalErrorNoTrace: a bug in the CLI (here: a nil stdout) is reported in one line with
// exit status 3, never as a Go panic trace.
func TestInternalErrorNoTrace(t *testing.T) {
	t.Setenv("CLINK_DEBUG", "")
	var errb bytes.Buffer
	code := run(context.Background(), []string{"version"}, nil, nil, &errb)
	if code != 3 || !strings.Contains(errb.String(), "clink-wasm: internal error:") || strings.Contains(errb.String(), "goroutine") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
}

// TestRunUsageErrors: every meaningless flag value is refused with exit status 2 and a message
// naming the flag, before anything runs.
func TestRunUsageErrors(t *testing.T) {
	in := writeTemp(t, "in.jsonl", "{\"u\":\"a\"}\n")
	base := []string{"run", "--module", abiTestdata + "counter.wasm", "--input", in, "--key", "u", "--state", "mem://"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-in-flight", "-1"}, "--max-in-flight must be > 0, not -1"},
		{[]string{"--max-in-flight", "0"}, "--max-in-flight must be > 0, not 0"},
		{[]string{"--call-timeout", "0s"}, "--call-timeout must be > 0, not 0s"},
		{[]string{"--call-timeout", "-1s"}, "--call-timeout must be > 0, not -1s"},
		{[]string{"--max-memory-pages", "0"}, "--max-memory-pages must be from 1 to 65536"},
		{[]string{"--max-memory-pages", "65537"}, "--max-memory-pages must be from 1 to 65536"},
		{[]string{"--max-memory-pages", "-1"}, "invalid value"},
		{[]string{"--hot-bytes", "lots"}, `--hot-bytes: bad size "lots"`},
		{[]string{"--hot-bytes", "-1m"}, `--hot-bytes: bad size "-1m"`},
		{[]string{"--hot-bytes", "0"}, "--hot-bytes must be > 0"},
		{[]string{"--checkpoint-interval", "-1s"}, "--checkpoint-interval must be >= 0"},
		{[]string{"--watermark-delay", "-1s", "--time-field", "ts"}, "--watermark-delay must be >= 0"},
		{[]string{"--watermark-delay", "1s"}, "--watermark-delay needs --time-field"},
		{[]string{"--key", ""}, "--key must not be empty"},
		{[]string{"--job", ""}, "--job must not be empty"},
		{[]string{"--order", "random"}, `--order must be key, input or none, not "random"`},
		{[]string{"--on-malformed", "ignore"}, "--on-malformed must be fail or skip"},
		{[]string{"--dead-letter", "x.jsonl"}, "--dead-letter needs --on-malformed=skip"},
		{[]string{"--restore", "yesterday"}, "want none, latest, latest-if-any or a checkpoint id"},
		{[]string{"--format", "xml"}, `--format must be jsonl or csv, not "xml"`},
		{[]string{"--endpoint", "geo=ftp://user:hunter22@x"}, "--endpoint geo=ftp://user:xxxxx@x"},
		{[]string{"--endpoint", "nonsense"}, "--endpoint nonsense: want NAME=URL"},
		{[]string{"--endpoints", "/nonexistent.json"}, "--endpoints: open /nonexistent.json"},
		{[]string{"--output", in}, "is the input file"},
		{[]string{"--on-malformed", "skip", "--dead-letter", in}, "is the input file"},
		{[]string{"--on-malformed", "skip", "--dead-letter", "x", "--output", "./x"}, "--output and --dead-letter must be different files"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--state", "ftp://user:hunter22@x/y"}, "--state must be a file:///dir, s3://bucket/prefix or mem:// URL, not ftp://user:xxxxx@x/y"},
		{[]string{"--state", "/tmp/dir"}, "--state must be a file:///dir"},
		{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
	} {
		r := runCLI(t, "", append(append([]string{}, base...), tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) || r.stdout != "" {
			t.Errorf("%v: exit %d, want 2 and %q:\n%s", tc.args, r.code, tc.want, r.stderr)
		}
		if strings.Contains(r.stderr, "hunter22") {
			t.Errorf("%v: a password reached stderr: %s", tc.args, r.stderr)
		}
	}
	if r := runCLI(t, "", "run", "--input", in); r.code != 2 || !strings.Contains(r.stderr, "--module and --input are required") {
		t.Errorf("missing module: %+v", r)
	}
	r := runCLI(t, "", "run", "--help")
	if r.code != 0 {
		t.Fatalf("--help: exit %d", r.code)
	}
	for _, w := range []string{"-hot-bytes", "latest-if-any", "1 to 65536", "0 takes only the final one"} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("run --help lacks %q", w)
		}
	}
}

// TestRunFailuresExitOne: failures of the pipeline or the module exit 1 with a message.
func TestRunFailuresExitOne(t *testing.T) {
	in := writeTemp(t, "in.jsonl", "{\"u\":\"a\"}\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--module", "nope.wasm", "--input", in}, "reading module"},
		{[]string{"--module", abiTestdata + "counter.wasm", "--input", "/nonexistent/in.jsonl"}, "opening input"},
		{[]string{"--module", abiTestdata + "counter.wasm", "--input", in, "--output", "/nonexistent/out"}, "creating output"},
		{[]string{"--module", abiTestdata + "counter.wasm", "--input", in, "--on-malformed", "skip", "--dead-letter", "/nonexistent/dl"}, "creating dead-letter file"},
		{[]string{"--module", abiTestdata + "counter.wasm", "--input", in, "--key", "u", "--order", "input"}, `operator "counter" declares keyed state (count)`},
		{[]string{"--module", abiTestdata + "trap.wasm", "--input", in, "--key", "u"}, `operator "trapper" failed at input line 1`},
		{[]string{"--module", abiTestdata + "counter.wasm", "--input", in, "--key", "u", "--restore", "latest"}, `no checkpoint of job "counter" in mem://`},
	} {
		r := runCLI(t, "", append(append([]string{"run"}, tc.args...), "--state", "mem://")...)
		if r.code != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, want 1 and %q:\n%s", tc.args, r.code, tc.want, r.stderr)
		}
	}
}

// TestRunFilesAndStats: output and dead-letter files, CSV chosen by the file extension, --stats
// as JSON, --quiet.
func TestRunFilesAndStats(t *testing.T) {
	dir := t.TempDir()
	in := writeTemp(t, "in.CSV", "u,n\na,1\nb\"x,2\na,3\n")
	out, dl := filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "dead.jsonl")
	r := runCLI(t, "", "run", "--module", abiTestdata+"counter.wasm", "--input", in, "--key", "u", "--state", "mem://",
		"--output", out, "--on-malformed", "skip", "--dead-letter", dl, "--stats", "--hot-bytes", "1m")
	if r.code != 0 || r.stdout != "" {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if b, _ := os.ReadFile(out); string(b) != "{\"count\":1}\n{\"count\":2}\n" {
		t.Errorf("output %q", b)
	}
	if b, _ := os.ReadFile(dl); !strings.Contains(string(b), `"line":3`) || !strings.Contains(string(b), `"raw":"b\"x,2"`) {
		t.Errorf("dead letters %q", b)
	}
	if !strings.Contains(r.stderr, "counter done: 2 records in, 2 out, 1 malformed skipped") {
		t.Errorf("summary: %s", r.stderr)
	}
	// The stats are the last thing on stderr: one JSON object.
	i := strings.Index(r.stderr, "{\n")
	var stats struct {
		Scheduler map[string]any `json:"scheduler"`
		State     struct{ HotLimit int64 }
	}
	if i < 0 || json.Unmarshal([]byte(r.stderr[i:]), &stats) != nil || stats.Scheduler == nil || stats.State.HotLimit != 1<<20 {
		t.Errorf("stats (hot limit from --hot-bytes): %s", r.stderr)
	}
	r = runCLI(t, "{\"u\":\"a\"}\n", "run", "--module", abiTestdata+"counter.wasm", "--input", "-", "--key", "u", "--state", "mem://", "--quiet")
	if r.code != 0 || r.stdout != "{\"count\":1}\n" || r.stderr != "" {
		t.Fatalf("quiet: %+v", r)
	}
}

// TestRunRestoreMessages: what a user reads about state: a restore that finds nothing fails;
// latest-if-any says it started empty; mem:// runs do not offer a resume.
func TestRunRestoreMessages(t *testing.T) {
	pool := "file://" + t.TempDir()
	in := writeTemp(t, "in.jsonl", "{\"u\":\"a\"}\n")
	args := []string{"run", "--module", abiTestdata + "counter.wasm", "--input", in, "--key", "u", "--state", pool}
	r := runCLI(t, "", append(args, "--restore", "latest")...)
	if r.code != 1 || !strings.Contains(r.stderr, `no checkpoint of job "counter" in `+pool) || !strings.Contains(r.stderr, "--restore latest-if-any") || r.stdout != "" {
		t.Fatalf("latest on nothing: %+v", r)
	}
	r = runCLI(t, "", append(args, "--restore", "latest-if-any")...)
	committed := regexp.MustCompile(`checkpoint (\d+) committed \(1 checkpoint, [^)]*\); it covers the end of the input; resume with --restore latest`)
	m := committed.FindStringSubmatch(r.stderr)
	if r.code != 0 || !strings.Contains(r.stderr, "started from empty state") || m == nil {
		t.Fatalf("latest-if-any on nothing: %+v", r)
	}
	// The same input again: the checkpoint covers it all, so nothing is read twice.
	r = runCLI(t, "", append(args, "--restore", "latest-if-any")...)
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "state: restored checkpoint "+m[1]+"\n") || !strings.Contains(r.stderr, "0 records in") {
		t.Fatalf("latest-if-any on one, same input: %+v", r)
	}
	// A new input continues from the state.
	in2 := writeTemp(t, "in2.jsonl", "{\"u\":\"a\"}\n")
	args[4] = in2
	r = runCLI(t, "", append(args, "--restore", "latest-if-any")...)
	if r.code != 0 || r.stdout != "{\"count\":2}\n" || !strings.Contains(r.stderr, "state: restored checkpoint ") {
		t.Fatalf("latest-if-any on one, new input: %+v", r)
	}
	// An upgrade says so.
	man := writeTemp(t, "m.json", `{"abi":1,"name":"counter","states":["count","seen"]}`)
	v2 := filepath.Join(t.TempDir(), "v2.wasm")
	if r := runCLI(t, "", "manifest", "embed", "--manifest", man, abiTestdata+"counter.wasm", "-o", v2); r.code != 0 {
		t.Fatalf("embed: %+v", r)
	}
	args[2], args[4] = v2, writeTemp(t, "in3.jsonl", "{\"u\":\"a\"}\n")
	r = runCLI(t, "", append(args, "--restore", "latest")...)
	if r.code != 0 || r.stdout != "{\"count\":3}\n" || !strings.Contains(r.stderr, "an upgrade: state kept: count; new, starting empty: seen") {
		t.Fatalf("upgrade: %+v", r)
	}
	r = runCLI(t, "", "run", "--module", abiTestdata+"counter.wasm", "--input", in, "--key", "u", "--state", "mem://")
	if r.code != 0 || strings.Contains(r.stderr, "--restore") || !strings.Contains(r.stderr, "to process memory (mem://): it ends with this run") {
		t.Fatalf("mem://: %+v", r)
	}
	// --checkpoint-interval 0 takes only the final checkpoint.
	r = runCLI(t, "", "run", "--module", abiTestdata+"counter.wasm", "--input", in, "--key", "u", "--state", "mem://", "--checkpoint-interval", "0")
	if r.code != 0 || !strings.Contains(r.stderr, "(1 checkpoint,") {
		t.Fatalf("interval 0: %+v", r)
	}
}

func TestInspectCommand(t *testing.T) {
	r := runCLI(t, "", "inspect", abiTestdata+"probe.wasm")
	if r.code != 0 || !strings.Contains(r.stdout, "operator:   probe") || !strings.Contains(r.stdout, "status:     usable") {
		t.Fatalf("%+v", r)
	}
	// Flags after the module, as the usage line allows.
	r = runCLI(t, "", "inspect", abiTestdata+"counter.wasm", "--json")
	var rep struct {
		Module   string `json:"module"`
		ABI      int    `json:"abi"`
		Usable   bool   `json:"usable"`
		Manifest struct {
			Name   string   `json:"name"`
			States []string `json:"states"`
		} `json:"manifest"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil || !rep.Usable || rep.ABI != 1 || rep.Manifest.Name != "counter" || rep.Manifest.States[0] != "count" {
		t.Fatalf("json: %+v", r)
	}
	r = runCLI(t, "", "inspect", abiTestdata+"abiv2.wasm")
	if r.code != 1 || !strings.Contains(r.stdout, "status:     UNUSABLE") || !strings.Contains(r.stderr, "is not usable (1 problem)") {
		t.Fatalf("unusable: %+v", r)
	}
	if r := runCLI(t, "", "inspect"); r.code != 2 || !strings.Contains(r.stderr, "give exactly one module file") {
		t.Fatalf("no module: %+v", r)
	}
	if r := runCLI(t, "", "inspect", "a.wasm", "b.wasm"); r.code != 2 {
		t.Fatalf("two modules: %+v", r)
	}
	if r := runCLI(t, "", "inspect", "/nonexistent.wasm"); r.code != 1 || !strings.Contains(r.stderr, "reading module") {
		t.Fatalf("missing: %+v", r)
	}
	if r := runCLI(t, "", "inspect", "--help"); r.code != 0 || !strings.Contains(r.stderr, "inspect [--json] OP.wasm") {
		t.Fatalf("help: %+v", r)
	}
}

// TestManifestEmbedCommand: the usage line's own form works (flags after the module: issue 15),
// as do -o first and the in-place rewrite.
func TestManifestEmbedCommand(t *testing.T) {
	src, err := os.ReadFile(abiTestdata + "counter.wasm")
	if err != nil {
		t.Fatal(err)
	}
	man := writeTemp(t, "m.json", `{"abi":1,"name":"counter2","states":["count"]}`)
	dir := t.TempDir()
	for i, form := range [][]string{
		{"--manifest", man, "IN", "-o", "OUT"}, // the usage line
		{"-o", "OUT", "--manifest", man, "IN"},
		{"IN", "--manifest", man, "-o", "OUT"},
		{"--manifest", man, "-o", "OUT", "--", "IN"},
	} {
		in, out := filepath.Join(dir, "in.wasm"), filepath.Join(dir, "out.wasm")
		os.WriteFile(in, src, 0o644)
		os.Remove(out)
		args := []string{"manifest", "embed"}
		for _, a := range form {
			args = append(args, strings.NewReplacer("IN", in, "OUT", out).Replace(a))
		}
		if r := runCLI(t, "", args...); r.code != 0 {
			t.Fatalf("form %d %v: %+v", i, form, r)
		}
		if r := runCLI(t, "", "inspect", out); !strings.Contains(r.stdout, "operator:   counter2") || !strings.Contains(r.stdout, "custom section") {
			t.Fatalf("form %d: inspect after embed:\n%s", i, r.stdout)
		}
		if b, _ := os.ReadFile(in); !bytes.Equal(b, src) {
			t.Fatalf("form %d: -o rewrote the input", i)
		}
	}
	in := filepath.Join(dir, "in.wasm")
	if r := runCLI(t, "", "manifest", "embed", in, "--manifest", man); r.code != 0 {
		t.Fatalf("in place: %+v", r)
	}
	if r := runCLI(t, "", "inspect", in); !strings.Contains(r.stdout, "operator:   counter2") {
		t.Fatalf("in place: %s", r.stdout)
	}
	bad := writeTemp(t, "bad.json", `{"abi":1,"name":"has space"}`)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"manifest"}, 2, "the only subcommand is embed"},
		{[]string{"manifest", "strip"}, 2, "the only subcommand is embed"},
		{[]string{"manifest", "embed", in}, 2, "give --manifest and one module"},
		{[]string{"manifest", "embed", "--manifest", man}, 2, "give --manifest and one module"},
		{[]string{"manifest", "embed", "--manifest", man, in, in}, 2, "give --manifest and one module"},
		{[]string{"manifest", "embed", "--manifest", bad, in}, 1, "is invalid"},
		{[]string{"manifest", "embed", "--manifest", "/nonexistent.json", in}, 1, "reading manifest"},
		{[]string{"manifest", "embed", "--manifest", man, "/nonexistent.wasm"}, 1, "reading module"},
		{[]string{"manifest", "embed", "--manifest", man, in, "-o", "/nonexistent/x.wasm"}, 1, "writing module"},
		{[]string{"manifest", "embed", "--help"}, 0, "manifest embed --manifest M.json IN.wasm [-o OUT.wasm]"},
	} {
		if r := runCLI(t, "", tc.args...); r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, want %d and %q:\n%s", tc.args, r.code, tc.code, tc.want, r.stderr)
		}
	}
}

func TestHumanFigures(t *testing.T) {
	for n, want := range map[int64]string{512: "512 B", 2048: "2.0 KiB", 3 << 20: "3.0 MiB", 5 << 30: "5.0 GiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
	for r, want := range map[float64]string{12: "12", 1500: "1.5k", 2.5e6: "2.50M"} {
		if got := humanRate(r); got != want {
			t.Errorf("humanRate(%v) = %q, want %q", r, got, want)
		}
	}
	if plural(1) != "" || plural(2) != "s" || listOrNone(nil) != "(none)" || listOrNone([]string{"a", "b"}) != "a, b" {
		t.Error("plural/listOrNone")
	}
}
