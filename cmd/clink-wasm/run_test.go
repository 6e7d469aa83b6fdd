package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

func TestProgressBar(t *testing.T) {
	var buf bytes.Buffer
	b := &progressBar{w: &buf}
	b.update(pipeline.Progress{BytesRead: 50, InputSize: 200, RecordsIn: 1500, Elapsed: time.Second})
	got := buf.String()
	for _, w := range []string{"\r[=======", " 25%", "1500 records", "1.5k/s"} {
		if !strings.Contains(got, w) {
			t.Errorf("progress line %q lacks %q", got, w)
		}
	}
	buf.Reset()
	b.clear()
	if !strings.HasPrefix(buf.String(), "\r") || strings.TrimSpace(buf.String()) != "" {
		t.Errorf("clear wrote %q", buf.String())
	}
}

// TestNoProgressOffTerminal: a pipe or file is not a terminal, so no bar is drawn there.
func TestNoProgressOffTerminal(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isTerminal(f) || isTerminal(&bytes.Buffer{}) {
		t.Fatal("a file counted as a terminal")
	}
}

// TestRunInProcess drives the CLI entry point without a subprocess: exit status and the
// summary line, and a panic-free usage error.
func TestRunInProcess(t *testing.T) {
	var out, errb bytes.Buffer
	in := strings.NewReader("{\"k\":\"a\"}\n{\"k\":\"a\"}\n")
	code := run(context.Background(), []string{"run", "--module", "../../host/abi/testdata/counter.wasm",
		"--input", "-", "--key", "k", "--state", "mem://", "--no-cache"}, in, &out, &errb)
	if code != 0 || out.String() != "{\"count\":1}\n{\"count\":2}\n" || !strings.Contains(errb.String(), "2 records in, 2 out") {
		t.Fatalf("exit %d, out %q, err %q", code, out.String(), errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), []string{"run", "--bogus"}, nil, &out, &errb); code != 2 {
		t.Fatalf("bad flag: exit %d: %s", code, errb.String())
	}
}

// TestRunOnErrorDeadLetter: with --on-error dead-letter the records the module faults on go to
// the --dead-letter file, each with the input line, the module's name and a reason naming the
// operator and the record, after --retries more attempts; the run goes on and succeeds. A
// malformed line skipped into the same file stays a whole line of its own.
func TestRunOnErrorDeadLetter(t *testing.T) {
	in := writeTemp(t, "in.jsonl", "{\"u\":\"a\"}\n{\"u\":\n{\"u\":\"b\"}\n{\"u\":\"a\"}\n")
	dl := filepath.Join(t.TempDir(), "dead.jsonl")
	r := runCLI(t, "", "run", "--module", abiTestdata+"trap.wasm", "--input", in, "--key", "u", "--state", "mem://",
		"--on-error", "dead-letter", "--retries", "2", "--on-malformed", "skip", "--dead-letter", dl)
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "3 records in, 0 out, 1 malformed skipped, 3 dead-lettered") {
		t.Fatalf("exit %d, out %q:\n%s", r.code, r.stdout, r.stderr)
	}
	b, err := os.ReadFile(dl)
	if err != nil {
		t.Fatal(err)
	}
	lines := map[int64]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		var d struct {
			Line                  int64
			Operator, Key, Reason string
			Raw                   string
			Attempts              int
		}
		if err := json.Unmarshal([]byte(l), &d); err != nil || lines[d.Line] {
			t.Fatalf("dead letter %q: %v", l, err)
		}
		lines[d.Line] = true
		if d.Line == 2 {
			if d.Operator != "" || d.Raw != "{\"u\":" || !strings.Contains(d.Reason, "invalid JSON") {
				t.Fatalf("malformed line: %s", l)
			}
			continue
		}
		key := map[int64]string{1: "a", 3: "b", 4: "a"}[d.Line]
		if d.Operator != "trapper" || d.Key != key || d.Attempts != 3 || d.Raw != `{"u":"`+key+`"}` ||
			!strings.Contains(d.Reason, fmt.Sprintf(`operator "trapper" failed at input line %d (key %q`, d.Line, key)) ||
			!strings.Contains(d.Reason, "negative amount") {
			t.Fatalf("dead letter %s", l)
		}
	}
	if len(lines) != 4 {
		t.Fatalf("dead letters for lines %v, want 1-4:\n%s", lines, b)
	}
	if r := runCLI(t, "", "run", "--help"); r.code != 0 || !strings.Contains(r.stderr, "-on-error string") || !strings.Contains(r.stderr, "-retries int") {
		t.Fatalf("run --help: exit %d:\n%s", r.code, r.stderr)
	}
	// Without it the first fault fails the run; bad values are usage errors.
	if r := runCLI(t, "", "run", "--module", abiTestdata+"trap.wasm", "--input", in, "--key", "u", "--state", "mem://", "--retries", "1", "--on-malformed", "skip"); r.code != 1 ||
		!strings.Contains(r.stderr, `operator "trapper" failed at input line 1`) {
		t.Fatalf("on-error fail: exit %d:\n%s", r.code, r.stderr)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--on-error", "skip"}, `--on-error must be fail or dead-letter, not "skip"`},
		{[]string{"--on-error", "dead-letter"}, "--on-error=dead-letter needs --dead-letter FILE"},
		{[]string{"--dead-letter", dl}, "--dead-letter needs --on-malformed=skip or --on-error=dead-letter"},
		{[]string{"--retries", "11"}, "--retries must be from 0 to 10, not 11"},
		{[]string{"--retries", "-1"}, "--retries must be from 0 to 10, not -1"},
	} {
		r := runCLI(t, "", append([]string{"run", "--module", abiTestdata + "trap.wasm", "--input", in, "--state", "mem://"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, want 2 and %q:\n%s", tc.args, r.code, tc.want, r.stderr)
		}
	}
}

// TestProfilesFromEnv: CLINK_CPUPROFILE and CLINK_MEMPROFILE make a command write Go profiles
// (gzipped protocol buffers, as pprof reads them), and the run's output is what it would be
// without them.
func TestProfilesFromEnv(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(in, []byte("{\"user\":\"a\"}\n{\"user\":\"b\"}\n{\"user\":\"a\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cpu, heap := filepath.Join(dir, "cpu.prof"), filepath.Join(dir, "heap.prof")
	cmd := exec.Command(os.Args[0], "run", "--module", "../../examples/wasm/counter/counter-as.wasm", "--input", in,
		"--key", "user", "--state", "mem://", "--quiet")
	cmd.Env = append(os.Environ(), "CLINK_CLI_CHILD=1", "CLINK_CPUPROFILE="+cpu, "CLINK_MEMPROFILE="+heap, "XDG_CACHE_HOME="+dir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("run with profiles: %v\n%s", err, out)
	}
	if want := "{\"key\":\"a\",\"count\":1}\n{\"key\":\"b\",\"count\":1}\n{\"key\":\"a\",\"count\":2}\n"; string(out) != want {
		t.Errorf("output %q, want %q", out, want)
	}
	for _, p := range []string{cpu, heap} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s is not a gzipped profile (%d bytes)", filepath.Base(p), len(b))
		}
	}
}
