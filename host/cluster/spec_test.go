package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

func parseSpec(t *testing.T, js string) *pipeline.Spec {
	t.Helper()
	s, err := pipeline.ParseSpec([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestNotScalable: specs a worker cannot split by partition are refused, naming the field.
func TestNotScalable(t *testing.T) {
	const src = `{"name": "in", "type": "kafka", "options": {"brokers": ["127.0.0.1:1"], "topics": ["in"]%s}}`
	const op = `{"name": "count", "module": "m.wasm", "inputs": ["in"], "key": %s}`
	const sink = `{"name": "out", "type": "kafka", "inputs": ["count"], "options": {"brokers": ["127.0.0.1:1"], "topic": "out"%s}}`
	spec := func(srcExtra, key, sinkExtra string) string {
		return `{"version": 1, "name": "j", "sources": [` + strings.Replace(src, "%s", srcExtra, 1) + `],
		  "operators": [` + strings.Replace(op, "%s", key, 1) + `], "sinks": [` + strings.Replace(sink, "%s", sinkExtra, 1) + `]}`
	}
	if _, err := scalable(parseSpec(t, spec("", `{"source": true}`, ""))); err != nil {
		t.Fatalf("a spec keyed by the Kafka key: %v", err)
	}
	for _, c := range []struct{ name, js, path string }{
		{"re-key by field", spec("", `"user"`, ""), "operators[0].key"},
		{"re-key by guest", spec("", `{"guest": true}`, ""), "operators[0].key"},
		{"key from a field", spec(`, "key_field": "user"`, `{"source": true}`, ""), "sources[0].options.key_field"},
		{"two topics", strings.Replace(spec("", `{"source": true}`, ""), `["in"]`, `["in", "in2"]`, 1), "sources[0].options.topics"},
		{"a pattern", strings.Replace(spec(`, "pattern": "^in"`, `{"source": true}`, ""), `, "topics": ["in"]`, "", 1), "sources[0].options.topics"},
		{"shared transactional IDs", spec("", `{"source": true}`, `, "transactional_id_prefix": "x"`), "sinks[0].options.transactional_id_prefix"},
		{"shared marker topic", spec("", `{"source": true}`, `, "marker_topic": "m"`), "sinks[0].options.marker_topic"},
	} {
		_, err := scalable(parseSpec(t, c.js))
		if !errors.Is(err, ErrNotScalable) || !strings.Contains(err.Error(), c.path) {
			t.Errorf("%s: %v, want ErrNotScalable naming %s", c.name, err, c.path)
		}
	}
}

// TestPartitionURL: partitions get their own pools under two-hex-digit prefixes, spread
// over all 256 for enough partitions, keeping the URL's query.
func TestPartitionURL(t *testing.T) {
	u, err := PartitionURL("s3://b/base?endpoint=http%3A%2F%2F127.0.0.1%3A1&path_style=true", "job", 7)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(u, "s3://b/base/") || !strings.Contains(u, "/job-p00007?") || !strings.Contains(u, "path_style=true") {
		t.Fatalf("partition 7: %s", u)
	}
	f, _ := PartitionURL("file:///var/state", "job", 7)
	if !strings.HasPrefix(f, "file:///var/state/") || !strings.HasSuffix(f, "/job-p00007") {
		t.Fatalf("file pool: %s", f)
	}
	prefixes := map[string]bool{}
	for p := range int32(4096) {
		u, _ := PartitionURL("s3://b/base", "job", p)
		prefixes[strings.Split(u, "/")[4]] = true
	}
	if len(prefixes) != 256 {
		t.Fatalf("4096 partitions over %d prefixes, want 256", len(prefixes))
	}
	if _, err := PartitionURL("http://x/y", "job", 0); err == nil {
		t.Fatal("an http:// state URL was accepted")
	}
}

// TestLayoutFixed: the cluster record fixes the topic's partition count; a worker seeing
// another count (the topic was grown) is refused.
func TestLayoutFixed(t *testing.T) {
	base, err := pipeline.StateURLForDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rec := clusterRecord{Job: "j", Topic: "in", Partitions: 6, KeyGroups: 128}
	if err := checkLayout(ctx, base, rec); err != nil {
		t.Fatal(err)
	}
	if err := checkLayout(ctx, base, rec); err != nil {
		t.Fatalf("the same layout again: %v", err)
	}
	rec.Partitions = 8
	if err := checkLayout(ctx, base, rec); !errors.Is(err, ErrLayoutChanged) {
		t.Fatalf("a grown topic: %v, want ErrLayoutChanged", err)
	}
}
