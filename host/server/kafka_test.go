package server

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"
)

func kafkaSpecFor(broker, extra string) map[string]any {
	src := map[string]any{"name": "in", "type": "kafka", "brokers": []any{broker}, "topics": []any{"in"}, "group": "counts", "request_timeout": "10s"}
	if extra == "sasl" {
		src["sasl"] = map[string]any{"mechanism": "PLAIN", "username_env": "kafka-user", "password_env": "kafka-password"}
	}
	return map[string]any{
		"checkpoints": map[string]any{"interval": "100ms"},
		"sources":     []any{src},
		"operators":   []any{map[string]any{"name": "count", "module": "counter", "inputs": []any{"in"}, "key": "user"}},
		"sinks":       []any{map[string]any{"name": "out", "type": "preview", "inputs": []any{"count"}}},
	}
}

func produce(t *testing.T, opts []kgo.Opt, keys, n int) {
	t.Helper()
	cl, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic("in"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for i := range n {
		for k := range keys {
			recs = append(recs, &kgo.Record{Key: fmt.Appendf(nil, "u%d", k), Value: fmt.Appendf(nil, `{"user":"u%d","seq":%d}`, k, i)})
		}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// TestKafkaHosted: a hosted pipeline reads a Kafka topic (kfake) into the preview exactly
// once; a broker outside the tenant's allowed_kafka_brokers is refused naming the field; SASL
// credentials come from the server's per-tenant secrets, which another tenant's spec naming
// the same secrets does not get.
func TestKafkaHosted(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in"), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser("PLAIN", "admin", "adminpw"),
		kfake.User("PLAIN", "bob", "bobpw",
			kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "in", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationAll, Allow: true},
			kfake.ACL{Resource: kmsg.ACLResourceTypeGroup, Name: "counts", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationAll, Allow: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	broker := c.ListenAddrs()[0]
	e := newEnv(t)
	e.srv.cfg.KafkaSecrets = func(tenant, name string) (string, bool) {
		v, ok := map[string]map[string]string{"acme": {"kafka-user": "bob", "kafka-password": "bobpw"}}[tenant][name]
		return v, ok
	}
	tok := e.tenant("acme", map[string]any{"api_requests_per_second": 1000000, "allowed_kafka_brokers": []string{broker}})
	other := e.tenant("other", map[string]any{"api_requests_per_second": 1000000, "allowed_kafka_brokers": []string{broker}})
	for _, k := range []string{tok, other} {
		if r := e.upload(k, "?name=counter", fixture(t, "counter.wasm")); r.code != 201 {
			t.Fatalf("upload: %d %s", r.code, r.body)
		}
	}
	// A broker the tenant may not reach.
	r := e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": "bad", "spec": kafkaSpecFor("10.1.2.3:9092", "")})
	if r.code != 422 || !strings.HasPrefix(r.problem(t).Field, "spec.sources[0].brokers[0]") || !strings.Contains(r.problem(t).Detail, "allowed_kafka_brokers") {
		t.Fatalf("a broker outside the allowlist: %d %s", r.code, r.body)
	}
	// The tenant's pipeline, with SASL from the server's secrets.
	r = e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": "counts", "spec": kafkaSpecFor(broker, "sasl")})
	if r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	var p PipelineView
	r.decode(t, &p)
	produce(t, []kgo.Opt{kgo.SeedBrokers(broker), kgo.SASL(plain.Auth{User: "admin", Pass: "adminpw"}.AsMechanism())}, 4, 5)
	if r := e.do("POST", "/api/v1/pipelines/"+p.ID+"/start", tok, "", nil); r.code != 202 {
		t.Fatalf("start: %d %s", r.code, r.body)
	}
	waitFor(t, "20 outputs", func() bool { return len(outputLines(e, tok, p.ID)) >= 20 })
	wantCounts(t, outputLines(e, tok, p.ID), 4, 5)
	// Another tenant naming the same secrets does not get acme's.
	r = e.json("POST", "/api/v1/pipelines", other, map[string]any{"name": "steal", "spec": kafkaSpecFor(broker, "sasl")})
	if r.code != 201 {
		t.Fatalf("create other: %d %s", r.code, r.body)
	}
	var po PipelineView
	r.decode(t, &po)
	r = e.do("POST", "/api/v1/pipelines/"+po.ID+"/start", other, "", nil)
	if r.code == 202 {
		// The run's end is recorded by its watcher after the job ends: wait for the record,
		// not for the job (the errors view read between the two was empty: a flake under -race).
		waitFor(t, "the other tenant's pipeline to fail", func() bool {
			var v PipelineView
			e.do("GET", "/api/v1/pipelines/"+po.ID, other, "", nil).decode(t, &v)
			return e.srv.rt.active(po.ID) == nil && v.State == "failed"
		})
		r = e.do("GET", "/api/v1/pipelines/"+po.ID+"/errors", other, "", nil)
	}
	if !strings.Contains(string(r.body), "kafka-user") || !strings.Contains(string(r.body), "not set") {
		t.Fatalf("another tenant's spec got at acme's secrets? %d %s", r.code, r.body)
	}
}
