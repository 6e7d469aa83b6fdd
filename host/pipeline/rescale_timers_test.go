package pipeline_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

func windowSpec(name, out string, par, count int, rate float64) string {
	return fmt.Sprintf(`
name: %s
checkpoints: {interval: 50ms}
sources:
  - {name: gen, type: generator, seed: 3, count: %d, rate: %v, keys: 3000, interval_ms: 100,
     event_time: {field: ts, watermark_every: 20}}
operators:
  - {name: windows, module: %s, inputs: [gen], key: key, parallelism: %d}
sinks:
  - {name: out, type: file, path: %s, inputs: [windows]}
`, name, count, rate, must(filepath.Abs("../../examples/wasm/tumbling/tumbling-as.wasm")), par, out)
}

// TestRescaleTimers: event-time timers registered before a savepoint fire after a restore at
// another parallelism (2 -> 3 -> 1), on the subtask that now owns their key: the windows
// equal an unrescaled run's.
func TestRescaleTimers(t *testing.T) {
	dir := t.TempDir()
	const count = 8000
	ref := filepath.Join(dir, "ref.jsonl")
	if _, err := runSpec(t, windowSpec("ref", ref, 1, count, 0), pipeline.Env{StateURL: "file://" + filepath.Join(dir, "refstate")}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.jsonl")
	env := pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")}
	for i, par := range []int{2, 3} {
		if i > 0 {
			env.Restore = "latest"
		}
		j := start(t, windowSpec("job", out, par, count, 8000), env)
		waitOutput(t, j, int64(100*(i+1)))
		if _, err := j.Stop(context.Background(), true); err != nil {
			t.Fatal(err)
		}
		if _, err := j.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	env.Restore = "latest"
	if _, err := runSpec(t, windowSpec("job", out, 1, count, 0), env); err != nil {
		t.Fatal(err)
	}
	got, want := readLines(t, out), readLines(t, ref)
	if !slices.Equal(sorted(got), sorted(want)) {
		t.Fatalf("%d windows, want %d", len(got), len(want))
	}
}
