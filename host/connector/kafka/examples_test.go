package kafka

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
	"github.com/twmb/franz-go/pkg/kfake"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// TestExampleKafka runs the README's Kafka example (examples/pipelines/kafka: load, count,
// show) against kfake, with the brokers line pointed at it: the counts it shows are, per
// user, those of the counter example's expected output.
func TestExampleKafka(t *testing.T) {
	dir := "../../../examples/pipelines/kafka"
	c := newCluster(t, kfake.SeedTopics(3, "events"), kfake.SeedTopics(3, "counts"))
	state := "file://" + t.TempDir()
	var out syncBuffer
	run := func(name, restore string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), `brokers: ["127.0.0.1:9092"]`) {
			t.Fatalf("%s: no brokers line to point at the test cluster", name)
		}
		brokers, _ := json.Marshal(c.Brokers)
		spec, err := pipeline.ParseSpec([]byte(strings.ReplaceAll(string(b), `["127.0.0.1:9092"]`, string(brokers))))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		conns := &pipeline.Connectors{}
		file.Register(conns)
		Register(conns)
		stdout.Register(conns, &out)
		j, err := pipeline.Start(context.Background(), spec, pipeline.Env{Connectors: conns, BaseDir: dir, StateURL: state, Restore: restore})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := j.Wait(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	run("load.yaml", "none")
	run("pipeline.yaml", "latest-if-any")
	run("pipeline.yaml", "latest-if-any") // restored at the end: nothing new, nothing twice
	run("show.yaml", "none")

	want, err := os.ReadFile("../../../examples/wasm/counter/expected.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	perKey := func(lines string) map[string][]string {
		m := map[string][]string{}
		for l := range strings.Lines(lines) {
			l = strings.TrimSuffix(l, "\n")
			var v struct{ Key string }
			if err := json.Unmarshal([]byte(l), &v); err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			m[v.Key] = append(m[v.Key], l)
		}
		return m
	}
	got, exp := perKey(out.b.String()), perKey(string(want))
	if len(got) != len(exp) {
		t.Fatalf("%d keys shown, want %d", len(got), len(exp))
	}
	for k, w := range exp {
		if !slices.Equal(got[k], w) {
			t.Fatalf("key %q: shown %v, want %v", k, got[k], w)
		}
	}
}
