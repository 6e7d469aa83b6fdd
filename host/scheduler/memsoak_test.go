package scheduler

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestMemSoak measures the peak RSS of the built CLI on the memory targets of issue 9, each in
// a subprocess whose rusage gives its peak (make soak; CLINK_MEM_SOAK=1). Besides the bound,
// each case checks the output, and the first the state its final checkpoint left.
func TestMemSoak(t *testing.T) {
	if os.Getenv("CLINK_MEM_SOAK") == "" {
		t.Skip("set CLINK_MEM_SOAK=1 (make soak): builds the CLI and runs 1M-record jobs")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "clink-wasm")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/clink-wasm")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	module := "../../examples/wasm/counter/counter-as.wasm"

	// 1M distinct keys into an 8 MiB hot tier: every key is dirty until the final checkpoint,
	// unless the tier spills.
	t.Run("distinct-keys-hot-8m", func(t *testing.T) {
		in := writeInput(t, dir, "distinct.jsonl", 1_000_000, func(i int) int { return i })
		st := "file://" + filepath.Join(dir, "st-distinct") + "?hot_bytes=8m"
		out := filepath.Join(dir, "out-distinct.jsonl")
		rss := runCLI(t, bin, "run", "--module", module, "--input", in, "--key", "user", "--state", st, "--output", out, "--quiet")
		checkCounts(t, out, 1_000_000, func(i int) int { return i })
		// The final state: a second run restoring it counts on from 1 for a sample of keys.
		in2 := writeInput(t, dir, "again.jsonl", 1000, func(i int) int { return i * 997 })
		out2 := filepath.Join(dir, "out-again.jsonl")
		runCLI(t, bin, "run", "--module", module, "--input", in2, "--key", "user", "--state", st, "--restore", "latest", "--output", out2, "--quiet")
		for key, n := range readCounts(t, out2) {
			if len(n) != 1 || n[0] != 2 {
				t.Fatalf("restored key %s counted %v, want [2]: the final checkpoint lost spilled state", key, n)
			}
		}
		t.Logf("peak RSS %d MiB (target ≤ 160 MiB)", rss>>20)
		if rss > 160<<20 {
			t.Errorf("peak RSS %d MiB > 160 MiB", rss>>20)
		}
	})

	// 1M events over 100k keys, a 1 MiB hot tier and a checkpoint every 100 ms, with the
	// default instance budget and in-flight cap.
	t.Run("100k-keys-hot-1m-ckpt-100ms", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		keys := make([]int, 1_000_000)
		for i := range keys {
			keys[i] = rng.IntN(100_000)
		}
		in := writeInput(t, dir, "k100k.jsonl", len(keys), func(i int) int { return keys[i] })
		st := "file://" + filepath.Join(dir, "st-100k") + "?hot_bytes=1m"
		out := filepath.Join(dir, "out-100k.jsonl")
		rss := runCLI(t, bin, "run", "--module", module, "--input", in, "--key", "user", "--state", st, "--checkpoint-interval", "100ms", "--output", out, "--quiet")
		checkCounts(t, out, len(keys), func(i int) int { return keys[i] })
		t.Logf("peak RSS %d MiB (target ≤ 256 MiB)", rss>>20)
		if rss > 256<<20 {
			t.Errorf("peak RSS %d MiB > 256 MiB", rss>>20)
		}
	})
}

func writeInput(t *testing.T, dir, name string, n int, key func(int) int) string {
	t.Helper()
	p := filepath.Join(dir, name)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	for i := range n {
		fmt.Fprintf(w, "{\"user\":\"u%d\",\"n\":%d}\n", key(i), i)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

// runCLI runs the CLI and returns its peak RSS in bytes.
//
// It runs it through this test binary as a small helper process (TestMemSoakHelper), which
// reports the CLI's rusage. Started from here directly, the CLI's ru_maxrss would start at this
// process's own peak: Go starts children with vfork (CLONE_VM), and exec folds the high-water
// mark of the memory it leaves, the parent's, into the child's. After the first case has read
// 1M outputs into a map, that alone read as ~300 MiB.
func runCLI(t *testing.T, bin string, args ...string) int64 {
	t.Helper()
	argv, err := json.Marshal(append([]string{bin}, args...))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMemSoakHelper$")
	cmd.Env = append(os.Environ(), "CLINK_MEM_SOAK_EXEC="+string(argv))
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	for line := range strings.Lines(stdout.String()) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "maxrss-bytes "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("helper reported no rusage:\n%s\n%s", stdout.String(), stderr.String())
	return 0
}

// TestMemSoakHelper is runCLI's helper process: it runs the command CLINK_MEM_SOAK_EXEC names
// (a JSON argv) and prints its peak RSS.
func TestMemSoakHelper(t *testing.T) {
	v := os.Getenv("CLINK_MEM_SOAK_EXEC")
	if v == "" {
		t.Skip("runCLI's helper process")
	}
	var argv []string
	if err := json.Unmarshal([]byte(v), &argv); err != nil || len(argv) == 0 {
		t.Fatalf("CLINK_MEM_SOAK_EXEC %q: %v", v, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		t.Fatal("no rusage")
	}
	fmt.Printf("maxrss-bytes %d\n", ru.Maxrss<<10) // KiB on Linux
}

func readCounts(t *testing.T, path string) map[string][]int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := map[string][]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var o struct {
			Key   string `json:"key"`
			Count int    `json:"count"`
		}
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			t.Fatalf("output line %q: %v", sc.Text(), err)
		}
		got[o.Key] = append(got[o.Key], o.Count)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// checkCounts: the counter emits, per key, 1, 2, ... in order: one output per input record.
func checkCounts(t *testing.T, path string, n int, key func(int) int) {
	t.Helper()
	want := map[string]int{}
	for i := range n {
		want[fmt.Sprint("u", key(i))]++
	}
	got := readCounts(t, path)
	if len(got) != len(want) {
		t.Fatalf("%d keys out, %d in", len(got), len(want))
	}
	for k, c := range want {
		seq := got[k]
		if len(seq) != c {
			t.Fatalf("key %s: %d outputs for %d records", k, len(seq), c)
		}
		for j, v := range seq {
			if v != j+1 {
				t.Fatalf("key %s: counts %v, want 1..%d in order", k, seq, c)
			}
		}
	}
}
