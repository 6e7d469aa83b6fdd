package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/connector/file"
	"github.com/clink-wasm/clink-wasm/host/connector/gen"
	"github.com/clink-wasm/clink-wasm/host/connector/stdout"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

func connectors() *pipeline.Connectors {
	c := &pipeline.Connectors{}
	file.Register(c)
	gen.Register(c)
	stdout.Register(c, nil)
	return c
}

func counterWasm(t testing.TB) string {
	p, err := filepath.Abs("../../examples/wasm/counter/counter-as.wasm")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// runSpec parses and runs a spec to its end.
func runSpec(t testing.TB, yaml string, env pipeline.Env) (pipeline.JobMetrics, error) {
	t.Helper()
	spec, err := pipeline.ParseSpec([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	if env.Connectors == nil {
		env.Connectors = connectors()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	j, err := pipeline.Start(ctx, spec, env)
	if err != nil {
		return pipeline.JobMetrics{}, err
	}
	return j.Wait()
}

func readLines(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// perKey groups counter outputs by key, in order.
func perKey(t testing.TB, lines []string) map[string][]string {
	out := map[string][]string{}
	for _, l := range lines {
		var v struct{ Key string }
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("bad output line %q: %v", l, err)
		}
		out[v.Key] = append(out[v.Key], l)
	}
	return out
}

func TestCounterParallel(t *testing.T) {
	for _, par := range []int{1, 2, 3} {
		t.Run(fmt.Sprint(par), func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "out.jsonl")
			spec := fmt.Sprintf(`
name: count
sources:
  - name: in
    type: file
    path: %s
operators:
  - name: count
    module: %s
    inputs: [in]
    key: user
    parallelism: %d
sinks:
  - name: out
    type: file
    path: %s
    inputs: [count]
    parallelism: 2
`, must(filepath.Abs("../../examples/wasm/counter/input.jsonl")), counterWasm(t), par, out)
			m, err := runSpec(t, spec, pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")})
			if err != nil {
				t.Fatal(err)
			}
			if m.State != pipeline.JobFinished || m.LastCheckpoint == nil || !m.LastCheckpoint.Final {
				t.Fatalf("metrics %+v", m)
			}
			got := readLines(t, out)
			want := readLines(t, "../../examples/wasm/counter/expected.jsonl")
			if !slices.Equal(sorted(got), sorted(want)) {
				t.Fatalf("multiset differs: %d lines, want %d", len(got), len(want))
			}
			gk, wk := perKey(t, got), perKey(t, want)
			for k, w := range wk {
				if !slices.Equal(gk[k], w) {
					t.Fatalf("key %q: got %v, want %v", k, gk[k], w)
				}
			}
			if ents, _ := os.ReadDir(filepath.Join(dir, ".out.jsonl.pending")); len(ents) != 0 {
				t.Fatalf("pending files left: %v", ents)
			}
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
