package cluster

import (
	"encoding/json"
	"fmt"

	"github.com/clink-wasm/clink-wasm/host/connector/kafka"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// ErrNotScalable is a spec the worker cannot run across machines (the error says which field
// and why).
var ErrNotScalable = fmt.Errorf("cluster: the pipeline cannot be scaled out")

// scalable checks that spec can run as one task per Kafka partition, and returns its Kafka
// source's configuration. Every record of a key must reach one task: the source is a single
// Kafka topic, and no operator re-keys (each is keyed by the Kafka key, which the producer's
// partitioner maps to one partition, or chained). Re-keying would need a repartition topic
// (docs/SCALING.md).
func scalable(spec *pipeline.Spec) (kafka.SourceConfig, error) {
	var sc kafka.SourceConfig
	bad := func(path, format string, args ...any) (kafka.SourceConfig, error) {
		return sc, fmt.Errorf("%w: %s: %s", ErrNotScalable, path, fmt.Sprintf(format, args...))
	}
	if len(spec.Sources) != 1 || spec.Sources[0].Type != "kafka" {
		return bad("sources", "a worker runs a pipeline with exactly one source, of type kafka (its partitions are what workers share)")
	}
	src := &spec.Sources[0]
	b, err := json.Marshal(src.Options)
	if err != nil {
		return bad("sources[0].options", "%v", err)
	}
	if err := json.Unmarshal(b, &sc); err != nil {
		return bad("sources[0].options", "%v", err)
	}
	if err := sc.Validate(); err != nil {
		return sc, fmt.Errorf("sources[0].options: %w", err)
	}
	if sc.Pattern != "" || len(sc.Topics) != 1 {
		return bad("sources[0].options.topics", "a worker reads exactly one topic (not a pattern): partition p of it is task p")
	}
	if sc.KeyField != "" {
		return bad("sources[0].options.key_field", "a worker keys by the Kafka key: a key taken from a field need not agree with the producer's partitioner, so a key's records could reach several workers")
	}
	for i, op := range spec.Operators {
		switch {
		case op.Chain:
		case op.Key == nil:
		case op.Key.Source:
		default:
			return bad(fmt.Sprintf("operators[%d].key", i), "operator %s re-keys its input; a worker sees one Kafka partition's records, so an operator must be keyed by the Kafka key (key: {source: true}) or chained. Re-keying across workers needs a repartition topic, which is not built yet (docs/SCALING.md)", op.Name)
		}
	}
	for i, sk := range spec.Sinks {
		if sk.Type != "kafka" {
			continue
		}
		for _, k := range []string{"transactional_id_prefix", "marker_topic"} {
			if _, ok := sk.Options[k]; ok {
				return bad(fmt.Sprintf("sinks[%d].options.%s", i, k), "a worker derives it per partition (each partition's task has its own transactional IDs and markers, so that its next owner fences exactly it): leave it unset")
			}
		}
	}
	return sc, nil
}

// taskSpec returns partition p's copy of spec: named for the partition, parallelism 1
// everywhere, no in-job restarts (the worker restarts a task, and only while it owns it),
// streaming, with its own state pool.
func taskSpec(spec *pipeline.Spec, p int32, stateURL string) (*pipeline.Spec, error) {
	b, err := pipeline.MarshalSpec(spec)
	if err != nil {
		return nil, err
	}
	ts, err := pipeline.ParseSpec(b)
	if err != nil {
		return nil, fmt.Errorf("copying the spec: %w", err)
	}
	ts.Name = TaskName(spec.Name, p)
	ts.Mode = pipeline.ModeStreaming
	ts.Parallelism = 1
	for i := range ts.Sources {
		ts.Sources[i].Parallelism = 1
	}
	for i := range ts.Operators {
		ts.Operators[i].Parallelism = 1
	}
	for i := range ts.Sinks {
		ts.Sinks[i].Parallelism = 1
	}
	ts.Restart = pipeline.RestartSpec{Strategy: "none"}
	ts.State.URL = stateURL
	return ts, nil
}
