package pipeline_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/connector/file"
	"github.com/clink-wasm/clink-wasm/host/connector/stdout"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// runExample runs an example's pipeline.yaml and returns its stdout lines.
func runExample(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "pipeline.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := pipeline.ParseSpec(data)
	if err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	c := &pipeline.Connectors{}
	file.Register(c)
	stdout.Register(c, &out)
	j, err := pipeline.Start(context.Background(), spec, pipeline.Env{Connectors: c, BaseDir: dir, StateURL: "file://" + t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Wait(); err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(out.b.String(), "\n"), "\n")
}

// byJSONKey groups lines by their "key" field, keeping order.
func byJSONKey(t *testing.T, lines []string) map[string][]string {
	m := map[string][]string{}
	for _, l := range lines {
		var v struct{ Key string }
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		m[v.Key] = append(m[v.Key], l)
	}
	return m
}

func TestExampleTumbling(t *testing.T) {
	checkExample(t, "../../examples/wasm/tumbling")
}

func TestExampleTwoStage(t *testing.T) {
	checkExample(t, "../../examples/pipelines/two-stage")
}

// checkExample compares an example's output with its expected.jsonl: the same multiset, and
// each key's lines in the same order.
func checkExample(t *testing.T, dir string) {
	got := runExample(t, dir)
	want := readLines(t, filepath.Join(dir, "expected.jsonl"))
	if !slices.Equal(sorted(got), sorted(want)) {
		t.Fatalf("got %d lines:\n%s\nwant %d", len(got), strings.Join(got, "\n"), len(want))
	}
	g, w := byJSONKey(t, got), byJSONKey(t, want)
	for k := range w {
		if !slices.Equal(g[k], w[k]) {
			t.Fatalf("key %s: out of order: %v", k, g[k])
		}
	}
}
