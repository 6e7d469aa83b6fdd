package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNewBuildTestCommands drives `clink-wasm new`, `build` and `test` as a user would, in a C
// project (the fastest toolchain), and checks their exit statuses: 0 for a passing table, 1
// for a failing one, 2 for a usage error.
func TestNewBuildTestCommands(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/clang"); err != nil {
		t.Skip("clang not installed (apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32)")
	}
	sdk, err := filepath.Abs("../../guest-sdk")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	clink := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := run(ctx, args, nil, &out, &errb)
		return code, out.String() + errb.String()
	}
	dir := filepath.Join(t.TempDir(), "op")
	if code, out := clink("new", "--lang", "c", "--sdk", sdk, dir); code != 0 || !strings.Contains(out, "clink-wasm test") {
		t.Fatalf("new: exit %d\n%s", code, out)
	}
	if code, out := clink("build", dir); code != 0 || !strings.Contains(out, "status:     usable") || !strings.Contains(out, "from custom section clink.manifest") {
		t.Fatalf("build: exit %d\n%s", code, out)
	}
	if code, out := clink("test", dir); code != 0 || !strings.Contains(out, "2 of 2 cases passed") {
		t.Fatalf("test: exit %d\n%s", code, out)
	}
	tests := filepath.Join(dir, "tests.json")
	b, err := os.ReadFile(tests)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tests, bytes.Replace(b, []byte(`"count": 42`), []byte(`"count": 43`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out := clink("test", dir); code != 1 || !strings.Contains(out, `- {"key":"carol","count":43}`) {
		t.Fatalf("test of a failing table: exit %d\n%s", code, out)
	}
	if code, out := clink("new", "--lang", "cobol", filepath.Join(t.TempDir(), "x")); code != 2 {
		t.Errorf("new --lang cobol: exit %d\n%s", code, out)
	}
	if code, out := clink("build", t.TempDir()); code != 1 || !strings.Contains(out, "not a clink-wasm project") {
		t.Errorf("build outside a project: exit %d\n%s", code, out)
	}
}
