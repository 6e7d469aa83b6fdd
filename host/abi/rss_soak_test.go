//go:build linux

package abi

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestRunawayGuestRSS is the `make soak` check of issue 9's memory target: a single runaway guest
// costs at most its memory limit × 1.25 + 64 MiB of host RSS. It builds the CLI, runs each
// runaway fixture through `clink-wasm run` in its own process (the compiler included: no
// compilation cache), and reads the process's peak RSS from its rusage.
//
// It needs a few GiB of free memory and a minute, so it runs only with CLINK_MEM_SOAK=1.
func TestRunawayGuestRSS(t *testing.T) {
	if os.Getenv("CLINK_MEM_SOAK") == "" {
		t.Skip("set CLINK_MEM_SOAK=1 (make soak) to measure a runaway guest's peak RSS")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "clink-wasm")
	build := exec.Command("go", "build", "-o", bin, "./cmd/clink-wasm")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the CLI: %v\n%s", err, out)
	}
	input := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(input, []byte("{\"k\":\"a\"}\n{\"k\":\"b\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		fixture string
		pages   uint64
		touches bool // the guest writes every page it gets, so its RSS reaches the limit
	}{
		{"memfill", DefaultMemoryPages, true},
		{"memfill", 16384, true},
		{"membomb", DefaultMemoryPages, false},
		{"membomb", 16384, false},
	} {
		t.Run(fmt.Sprintf("%s/%dMiB", tc.fixture, tc.pages>>4), func(t *testing.T) {
			limit := tc.pages << 16
			bound := limit + limit/4 + 64<<20
			cmd := exec.Command(bin, "run", "--module", filepath.Join("testdata", tc.fixture+".wasm"),
				"--input", input, "--state", "mem://", "--no-cache", "--quiet",
				"--max-memory-pages", fmt.Sprint(tc.pages))
			out, err := cmd.CombinedOutput()
			if _, ok := err.(*exec.ExitError); !ok {
				t.Fatalf("want the run to fail with the guest's fault, got %v\n%s", err, out)
			}
			if !strings.Contains(string(out), "ran out of memory") {
				t.Fatalf("the run did not fail with an out-of-memory fault:\n%s", out)
			}
			peak := uint64(cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss) << 10 // KiB on Linux
			t.Logf("%s, limit %d MiB: peak RSS %d MiB (bound %d MiB)", tc.fixture, limit>>20, peak>>20, bound>>20)
			if peak > bound {
				t.Errorf("peak RSS %d MiB is over the bound of %d MiB (limit × 1.25 + 64 MiB)", peak>>20, bound>>20)
			}
			if tc.touches && peak < limit*9/10 {
				t.Errorf("peak RSS %d MiB is below 90%% of the %d MiB the guest filled: the measurement is wrong", peak>>20, limit>>20)
			}
		})
	}
}
