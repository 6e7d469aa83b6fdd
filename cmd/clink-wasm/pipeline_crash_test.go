package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// TestMain lets the crash test run this test binary as the CLI (CLINK_CLI_CHILD=1), so that
// a child can be SIGKILLed without building another binary.
func TestMain(m *testing.M) {
	if os.Getenv("CLINK_CLI_CHILD") == "1" {
		os.Exit(mainCode())
	}
	os.Exit(m.Run())
}

// crashInput writes n records over users keys, deterministically.
func crashInput(t *testing.T, path string, n, users int, seed uint64) []string {
	r := rand.New(rand.NewPCG(seed, 7))
	var b strings.Builder
	keys := make([]string, n)
	for i := range n {
		u := fmt.Sprintf("u%03d", r.IntN(users))
		if r.IntN(10) == 0 {
			u = "hot" // a hot key, so one key has a long history
		}
		keys[i] = u
		fmt.Fprintf(&b, "{\"user\":%q,\"seq\":%d}\n", u, i)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return keys
}

// counterModel is what a counter outputs for a sequence of keys: per key, counts 1..n in
// order. It also returns the final state.
func counterModel(keys []string) (map[string][]string, map[string]int64) {
	out := map[string][]string{}
	st := map[string]int64{}
	for _, k := range keys {
		st[k]++
		kb, _ := json.Marshal(k)
		out[k] = append(out[k], fmt.Sprintf(`{"key":%s,"count":%d}`, kb, st[k]))
	}
	return out, st
}

type crashSpec struct {
	name string
	spec func(dir, input, wasm string) string
	// flags, instead of spec, runs the flag form with these arguments.
	flags func(dir, input, wasm string) []string
	model func(keys []string) (out map[string][]string, states []map[string]int64)
	// stateQuery is appended to the state URL (pool options); stats adds --stats and reads
	// the scheduler's captured-input counts from a successful run's report.
	stateQuery string
	stats      bool
}

var crashSpecs = []crashSpec{
	{
		// The flag form: file -> one operator -> file, the same runtime underneath.
		name: "flag-form",
		flags: func(dir, input, wasm string) []string {
			return []string{"run", "--module", wasm, "--input", input, "--key", "user", "--job", "crashflag",
				"--output", filepath.Join(dir, "out.jsonl"), "--checkpoint-interval", "15ms"}
		},
		model: func(keys []string) (map[string][]string, []map[string]int64) {
			out, st := counterModel(keys)
			return out, []map[string]int64{st}
		},
	},
	{
		// The flag form over a hot tier of a few dozen keys: reads go cold, records park
		// behind their keys and wait for room, and barriers capture them as checkpoint input
		// (host/scheduler/capture.go), which a restore replays first.
		name: "flag-form-cold",
		flags: func(dir, input, wasm string) []string {
			return []string{"run", "--module", wasm, "--input", input, "--key", "user", "--job", "crashcold",
				"--output", filepath.Join(dir, "out.jsonl"), "--checkpoint-interval", "5ms", "--max-in-flight", "32"}
		},
		model: func(keys []string) (map[string][]string, []map[string]int64) {
			out, st := counterModel(keys)
			return out, []map[string]int64{st}
		},
		stateQuery: "?hot_bytes=12k",
		stats:      true,
	},
	{
		name: "one-operator",
		spec: func(dir, input, wasm string) string {
			return fmt.Sprintf(`
name: crash1
checkpoints: {interval: 15ms}
sources: [{name: in, type: file, path: %s}]
operators:
  - {name: count, module: %s, inputs: [in], key: user, parallelism: 2}
sinks: [{name: out, type: file, path: %s, inputs: [count]}]
`, input, wasm, filepath.Join(dir, "out.jsonl"))
		},
		model: func(keys []string) (map[string][]string, []map[string]int64) {
			out, st := counterModel(keys)
			return out, []map[string]int64{st}
		},
	},
	{
		// Two operators with a re-key between them: the second counts, per count value, how
		// many users reached it. Its output multiset and per-key order do not depend on how
		// the first stage's subtasks interleave.
		name: "two-operators-rekey",
		spec: func(dir, input, wasm string) string {
			return fmt.Sprintf(`
name: crash2
checkpoints: {interval: 15ms}
sources: [{name: in, type: file, path: %s}]
operators:
  - {name: perUser, module: %s, inputs: [in], key: user, parallelism: 2}
  - {name: perCount, module: %s, inputs: [perUser], key: count, parallelism: 3}
sinks: [{name: out, type: file, path: %s, inputs: [perCount], parallelism: 2}]
`, input, wasm, wasm, filepath.Join(dir, "out.jsonl"))
		},
		model: func(keys []string) (map[string][]string, []map[string]int64) {
			_, st1 := counterModel(keys)
			var counts []string
			for _, n := range st1 {
				for c := int64(1); c <= n; c++ {
					counts = append(counts, strconv.FormatInt(c, 10))
				}
			}
			out, st2 := counterModel(counts) // per key, the order is 1..n whatever the interleaving
			return out, []map[string]int64{st1, st2}
		},
	},
}

// The two-operator pipeline again over a hot tier of a few dozen keys: both operators'
// barriers capture records, and the records between them travel in-band behind the barriers.
func init() {
	for _, cs := range crashSpecs {
		if cs.name == "two-operators-rekey" {
			cs.name, cs.stateQuery = cs.name+"-cold", "?hot_bytes=12k"
			crashSpecs = append(crashSpecs, cs)
			return
		}
	}
}

func TestPipelineCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	rounds := 3 // per spec and the flag form: 9 kill points, plus the kills of restarted runs
	if os.Getenv("CLINK_SOAK") != "" {
		rounds = 30
	}
	wasm, err := filepath.Abs("../../examples/wasm/counter/counter-as.wasm")
	if err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	kills := 0
	var capt captureCounts
	for _, cs := range crashSpecs {
		for round := range rounds {
			seed := uint64(round*31 + len(cs.name))
			t.Run(fmt.Sprintf("%s/%d", cs.name, round), func(t *testing.T) {
				kills += crashRound(t, cs, wasm, cache, seed, &capt)
			})
		}
	}
	t.Logf("%d SIGKILLs; the cold runs that finished captured %d records at barriers and replayed %d restored ones", kills, capt.captured, capt.replayed)
	if kills < 5 {
		t.Fatalf("only %d kill points", kills)
	}
	if capt.runs > 0 && capt.captured == 0 {
		t.Fatal("no barrier of the cold runs captured a record: the captured input went untested")
	}
}

// captureCounts sums the scheduler's captured-input counts of the runs that finished.
type captureCounts struct{ runs, captured, replayed int64 }

// add reads a --stats report (JSON on stderr, after any other line).
func (c *captureCounts) add(t *testing.T, stderr string) {
	t.Helper()
	i := strings.Index(stderr, "{")
	if i < 0 {
		t.Fatalf("no --stats report in:\n%s", stderr)
	}
	var rep struct {
		Scheduler struct{ CapturedRecords, ReplayedRecords, CaptureFallbacks int64 }
	}
	if err := json.NewDecoder(strings.NewReader(stderr[i:])).Decode(&rep); err != nil {
		t.Fatalf("--stats report: %v\n%s", err, stderr)
	}
	if rep.Scheduler.CaptureFallbacks != 0 {
		t.Fatalf("%d barriers could not capture and drained instead", rep.Scheduler.CaptureFallbacks)
	}
	c.runs++
	c.captured += rep.Scheduler.CapturedRecords
	c.replayed += rep.Scheduler.ReplayedRecords
}

func crashRound(t *testing.T, cs crashSpec, wasm, cache string, seed uint64, capt *captureCounts) int {
	rng := rand.New(rand.NewPCG(seed, 99))
	dir := t.TempDir()
	input := filepath.Join(dir, "in.jsonl")
	keys := crashInput(t, input, 20000+rng.IntN(10000), 300, seed)
	base := func() []string {
		if cs.flags != nil {
			return cs.flags(dir, input, wasm)
		}
		specPath := filepath.Join(dir, "spec.yaml")
		if err := os.WriteFile(specPath, []byte(cs.spec(dir, input, wasm)), 0o644); err != nil {
			t.Fatal(err)
		}
		return []string{"run", "--pipeline", specPath}
	}()
	stateURL := "file://" + filepath.Join(dir, "state") + cs.stateQuery
	if cs.stats {
		base = append(base, "--stats")
	}
	phases := []string{"acknowledged", "record-written", "sink-committed"}
	kills := 0
	restore := "none"
	for attempt := 0; ; attempt++ {
		if attempt > 12 {
			t.Fatal("no successful run after 12 attempts")
		}
		args := append(slices.Clone(base), "--state", stateURL, "--restore", restore, "--quiet")
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), "CLINK_CLI_CHILD=1", "XDG_CACHE_HOME="+cache)
		var killAfter time.Duration
		if attempt < 3 { // the first runs are killed: at a commit phase, or at a random moment
			if rng.IntN(2) == 0 {
				cmd.Env = append(cmd.Env, fmt.Sprintf("CLINK_TEST_KILL_AT=%s:%d", phases[rng.IntN(len(phases))], 1+rng.IntN(3)))
			} else {
				killAfter = time.Duration(rng.IntN(250)+1) * time.Millisecond
			}
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		killed, err := runKillable(t, cmd, killAfter)
		if err == nil {
			if cs.stats {
				capt.add(t, stderr.String())
			}
			break
		}
		if killed {
			kills++
			// The same command with --restore latest; before the first checkpoint, the
			// opt-in "latest if there is one".
			restore = "latest"
			if rng.IntN(2) == 0 {
				restore = "if-any"
			}
			continue
		}
		// The one no-checkpoint message of each form ("no checkpoint to restore", "no
		// checkpoint of job X in POOL to restore").
		if strings.Contains(stderr.String(), "no checkpoint") && strings.Contains(stderr.String(), "to restore") && restore == "latest" {
			restore = "none" // the crash came before the first checkpoint: run the first command again
			continue
		}
		t.Fatalf("run %d (%v): %v\n%s", attempt, args, err, stderr.String())
	}
	want, states := cs.model(keys)
	checkOutput(t, filepath.Join(dir, "out.jsonl"), want)
	checkState(t, filepath.Join(dir, "state"), states)
	if ents, _ := os.ReadDir(filepath.Join(dir, ".out.jsonl.pending")); len(ents) != 0 {
		t.Errorf("pending output left: %d files", len(ents))
	}
	return kills
}

// checkOutput compares the committed output with the model: same lines per key, in order
// (so the same multiset, no duplicate, no gap).
func checkOutput(t *testing.T, path string, want map[string][]string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	n := 0
	for l := range strings.Lines(string(b)) {
		l = strings.TrimSuffix(l, "\n")
		var v struct{ Key string }
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("output line %d is not JSON: %q", n+1, l)
		}
		got[v.Key] = append(got[v.Key], l)
		n++
	}
	total := 0
	for k, w := range want {
		total += len(w)
		if !slices.Equal(got[k], w) {
			g := got[k]
			t.Fatalf("key %q: %d outputs, want %d; first difference at %d", k, len(g), len(w), firstDiff(g, w))
		}
	}
	if n != total {
		t.Fatalf("%d output lines, want %d", n, total)
	}
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// checkState reads each operator's state at the final checkpoint straight from the pool and
// compares it with the model.
func checkState(t *testing.T, stateDir string, states []map[string]int64) {
	t.Helper()
	ctx := context.Background()
	recs, err := filepath.Glob(filepath.Join(stateDir, "jobs", "_", "*", "checkpoints", "*.json"))
	if err != nil || len(recs) == 0 {
		t.Fatalf("no checkpoint record: %v", err)
	}
	slices.Sort(recs)
	b, err := os.ReadFile(recs[len(recs)-1])
	if err != nil {
		t.Fatal(err)
	}
	var rec pipeline.CheckpointRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if !rec.Final {
		t.Fatalf("the last checkpoint %d is not the final one", rec.ID)
	}
	st, err := state.Open(ctx, "file://"+stateDir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	names := []string{}
	for n := range rec.Operators {
		names = append(names, n)
	}
	// Operators in spec order: perUser/count first.
	slices.SortFunc(names, func(a, b string) int {
		order := map[string]int{"count": 0, "operator": 0, "perUser": 0, "perCount": 1}
		return order[a] - order[b]
	})
	for i, name := range names {
		oc := rec.Operators[name]
		be, err := st.Operator(ctx, state.OperatorOptions{Name: oc.StateName, RestoreFrom: oc.StateCheckpoint})
		if err != nil {
			t.Fatal(err)
		}
		if err := be.Open(oc.States); err != nil {
			t.Fatal(err)
		}
		var keys []state.Key
		var want []int64
		for k, n := range states[i] {
			keys = append(keys, state.Key{State: 0, Record: []byte(k)})
			want = append(want, n)
		}
		done := make(chan []state.Fetched, 1)
		be.Fetch(keys, func(f []state.Fetched, err error) {
			if err != nil {
				t.Error(err)
			}
			done <- f
		})
		got := <-done
		for j, f := range got {
			if !f.Found || len(f.Value) != 8 || int64(binary.LittleEndian.Uint64(f.Value)) != want[j] {
				t.Fatalf("operator %s key %q: state %v (found %v), want %d", name, keys[j].Record, f.Value, f.Found, want[j])
			}
		}
		be.Close()
	}
}

// TestPipelineSIGTERM: a streaming job stopped by SIGTERM exits with a summary naming the
// last committed checkpoint and the input position it covers, and --restore latest resumes.
func TestPipelineSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	wasm, _ := filepath.Abs("../../examples/wasm/counter/counter-as.wasm")
	dir := t.TempDir()
	spec := filepath.Join(dir, "spec.yaml")
	os.WriteFile(spec, []byte(fmt.Sprintf(`
name: term
checkpoints: {interval: 20ms}
sources: [{name: g, type: generator, rate: 5000}]
operators: [{name: count, module: %s, inputs: [g], key: key}]
sinks: [{name: out, type: file, path: %s, inputs: [count]}]
`, wasm, filepath.Join(dir, "out.jsonl"))), 0o644)
	for i, restore := range []string{"none", "latest"} {
		cmd := exec.Command(os.Args[0], "run", "--pipeline", spec, "--state", "file://"+filepath.Join(dir, "state"), "--restore", restore)
		cmd.Env = append(os.Environ(), "CLINK_CLI_CHILD=1")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Wait for a committed checkpoint, then SIGTERM.
		for range 500 {
			if ids, _ := filepath.Glob(filepath.Join(dir, "state", "jobs", "_", "term", "checkpoints", "*.json")); len(ids) > i {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		cmd.Process.Signal(syscall.SIGTERM)
		err := cmd.Wait()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Fatalf("exit: %v\n%s", err, stderr.String())
		}
		s := stderr.String()
		for _, want := range []string{"term stopped", "committed; it covers the input up to g: gen-0 at record ", "resume with --restore latest"} {
			if !strings.Contains(s, want) {
				t.Fatalf("summary lacks %q:\n%s", want, s)
			}
		}
		if i == 1 && !strings.Contains(s, "(restored from checkpoint ") {
			t.Fatalf("the second run did not restore:\n%s", s)
		}
	}
}

// runKillable runs cmd to its end, sending it SIGKILL after killAfter if that is positive
// (the crash tests' random moment; a kill point of CLINK_TEST_KILL_AT kills it from inside).
// killed reports that a signal ended it.
func runKillable(t *testing.T, cmd *exec.Cmd, killAfter time.Duration) (killed bool, err error) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if killAfter > 0 {
		tm := time.AfterFunc(killAfter, func() { cmd.Process.Signal(syscall.SIGKILL) })
		defer tm.Stop()
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled(), err
}
