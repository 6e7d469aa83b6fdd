package main

import (
	"bytes"
	"context"
	"os"
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
