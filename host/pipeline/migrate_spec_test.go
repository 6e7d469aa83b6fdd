package pipeline_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// TestHostMigrationInSpecs: the spec form migrates a restored checkpoint through the module's
// clink_migrate also when the restore changes the parallelism (2 -> 3: each new subtask
// migrates the key groups it owns, read from the old subtasks' state), and a migration that
// traps fails the job without a restart, naming operator, state and key.
func TestHostMigrationInSpecs(t *testing.T) {
	dir := t.TempDir()
	abiDir, _ := filepath.Abs("../abi/testdata")
	out := filepath.Join(dir, "out.jsonl")
	spec := func(mod string, par int, in string) string {
		return fmt.Sprintf(`
name: migrate
restart: {strategy: fixed-delay, attempts: 3, delay: 1ms}
sources: [{name: in, type: file, path: %s}]
operators: [{name: count, module: %s, inputs: [in], key: u, parallelism: %d}]
sinks: [{name: out, type: file, path: %s, inputs: [count]}]
`, in, filepath.Join(abiDir, mod+".wasm"), par, out)
	}
	appendLines := func(in string, keys ...string) {
		f, err := os.OpenFile(in, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			fmt.Fprintf(f, "{\"u\":%q}\n", k)
		}
		f.Close()
	}
	count := map[string]int{}
	var keys []string
	for i := range 500 {
		k := fmt.Sprintf("k%d", i%70)
		keys = append(keys, k)
		count[k]++
	}
	in1, in2 := filepath.Join(dir, "in1.jsonl"), filepath.Join(dir, "in2.jsonl")
	appendLines(in1, keys...)
	env := pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")}
	if _, err := runSpec(t, spec("migv1", 2, in1), env); err != nil {
		t.Fatal(err)
	}
	// Version 2 at parallelism 3 reads another file.
	var next, want []string
	for i := range 70 {
		k := fmt.Sprintf("k%d", i)
		next = append(next, k)
		want = append(want, fmt.Sprintf(`{"count":%d,"v":2}`, count[k]+1))
	}
	appendLines(in2, next...)
	env.Restore = "latest"
	m, err := runSpec(t, spec("migv2", 3, in2), env)
	if err != nil {
		t.Fatalf("v2: %v", err)
	}
	var got []string
	for _, l := range readLines(t, out) {
		if strings.Contains(l, `"v":2`) {
			got = append(got, l)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		all := readLines(t, out)
		t.Logf("%d lines, last %q", len(all), all[len(all)-3:])
		t.Fatalf("v2 output\n%q\nwant\n%q", got, want)
	}

	// A key whose migration traps: the job fails at once, not after its restarts.
	os.RemoveAll(filepath.Join(dir, "state"))
	os.Remove(out)
	appendLines(filepath.Join(dir, "p1.jsonl"), "a", "poison", "b")
	env.Restore = ""
	if _, err := runSpec(t, spec("migv1", 2, filepath.Join(dir, "p1.jsonl")), env); err != nil {
		t.Fatal(err)
	}
	appendLines(filepath.Join(dir, "p2.jsonl"), "a")
	env.Restore = "latest"
	m, err = runSpec(t, spec("migv2", 1, filepath.Join(dir, "p2.jsonl")), env)
	var me *pipeline.MigrationError
	if !errors.Is(err, pipeline.ErrMigration) || !errors.As(err, &me) || me.Operator != "count" || me.State != "count" || string(me.Key) != "poison" ||
		!strings.Contains(err.Error(), "cannot migrate poison") || m.Restarts != 0 {
		t.Fatalf("trapping migration: %v (restarts %d)", err, m.Restarts)
	}
}
