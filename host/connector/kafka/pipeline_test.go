package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// These tests run Kafka → counter → Kafka jobs through the pipeline runtime (host/pipeline)
// against kfake, fail attempts at each step of the exactly-once commit (the runtime then
// restarts in process, from what recovery decides), and read the output with read_committed:
// per key, the counts 1..n in order, each exactly once.

var counterWasm = func() string {
	p, _ := filepath.Abs("../../../examples/wasm/counter/counter-as.wasm")
	return p
}()

// produceUsers writes n records {"user","seq"} keyed by user, starting at seq from, and
// returns the users in order.
func produceUsers(t testing.TB, c Config, topic string, from, n, users int) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	keys := make([]string, n)
	recs := make([]*kgo.Record, n)
	for i := range n {
		u := fmt.Sprintf("u%02d", (from+i)*7%users)
		keys[i] = u
		recs[i] = &kgo.Record{Key: []byte(u), Value: fmt.Appendf(nil, `{"user":%q,"seq":%d}`, u, from+i)}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// checkCounts reads topic with read_committed and checks that each key's outputs are
// exactly the counts 1..n of the model, in order.
func checkCounts(t testing.TB, c Config, topic string, keys []string) {
	t.Helper()
	want := map[string]int{}
	for _, k := range keys {
		want[k]++
	}
	got := map[string][]int{}
	for _, r := range readTopic(t, c, topic, true) {
		var v struct {
			Key   string
			Count int
		}
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("output %q: %v", r.Value, err)
		}
		if string(r.Key) != v.Key {
			t.Fatalf("output %s has Kafka key %q", r.Value, r.Key)
		}
		got[v.Key] = append(got[v.Key], v.Count)
	}
	for k, n := range want {
		g := got[k]
		for i, cnt := range g {
			if cnt != i+1 {
				t.Fatalf("key %s: outputs %v..., want 1..%d (output %d is %d)", k, g[:min(len(g), i+3)], n, i, cnt)
			}
		}
		if len(g) != n {
			t.Fatalf("key %s: %d outputs, want %d", k, len(g), n)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d keys in the output, want %d", len(got), len(want))
	}
}

func kafkaSpec(name string, c Config, extra string) string {
	brokers, _ := json.Marshal(c.Brokers)
	return fmt.Sprintf(`
name: %s
checkpoints: {interval: 10ms, timeout: 30s}
restart: {strategy: fixed-delay, attempts: 20, delay: 1ms}
sources:
  - {name: in, type: kafka, brokers: %s, topics: [in], group: counters, stop_at: latest, parallelism: 2, request_timeout: 10s}
operators:
  - {name: count, module: %s, inputs: [in], key: user, parallelism: 2}
sinks:
  - {name: out, type: kafka, brokers: %s, topic: out, inputs: [count], parallelism: 2, request_timeout: 10s%s}
`, name, brokers, counterWasm, brokers, extra)
}

// fault fails one step of a checkpoint commit, once: the nth time phase is reached.
type fault struct {
	phase string // a pipeline.CommitPhase, or "decide-partial": subtask 1's commit in Decide
	nth   int

	mu    sync.Mutex
	seen  int
	fired bool
}

var errInjected = errors.New("injected failure")

func (f *fault) at(phase string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fired || phase != f.phase {
		return nil
	}
	f.seen++
	if f.seen == f.nth {
		f.fired = true
		return errInjected
	}
	return nil
}

// runKafkaJob runs spec to its end with the faults injected, and returns its metrics.
func runKafkaJob(t testing.TB, spec, stateURL, restore string, faults ...*fault) pipeline.JobMetrics {
	t.Helper()
	sp, err := pipeline.ParseSpec([]byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	conns := &pipeline.Connectors{}
	Register(conns)
	conns.RegisterSink("kafka", func(s *pipeline.SinkSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Sink, error) {
		sk, err := NewPipelineSink(s, o, env)
		if ps, ok := sk.(*pipelineSink); ok {
			ps.beforeCommit = func(_ uint64, subtask int) error {
				if subtask != 1 {
					return nil
				}
				var err error
				for _, f := range faults {
					if e := f.at("decide-partial"); e != nil {
						err = e
					}
				}
				return err
			}
		}
		return sk, err
	})
	env := pipeline.Env{Connectors: conns, StateURL: stateURL, Restore: restore, Log: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		OnCommitPhase: func(ph pipeline.CommitPhase, _ uint64) error {
			var err error
			for _, f := range faults {
				if e := f.at(string(ph)); e != nil {
					err = e
				}
			}
			return err
		}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	j, err := pipeline.Start(ctx, sp, env)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-j.Done():
	case <-ctx.Done():
		j.Stop(context.Background(), false)
		t.Fatal("the job did not finish")
	}
	m, err := j.Wait()
	if err != nil {
		t.Fatalf("job: %v", err)
	}
	for _, f := range faults {
		if !f.fired {
			t.Fatalf("fault %s#%d never fired (seen %d)", f.phase, f.nth, f.seen)
		}
	}
	return m
}

// TestPipelineExactlyOnce fails an attempt at each step of the exactly-once commit (before
// the prepared record, between it and the decision, in the middle of the decision with one
// subtask committed and the other not, between the decision and the record, after the
// record), lets the runtime restart in process, and checks the committed output. Then it
// appends input and restarts cleanly from the final checkpoint: reading resumes at its
// offsets, and the counts go on from its state.
func TestPipelineExactlyOnce(t *testing.T) {
	phases := []string{"acknowledged", "prepared", "decide-partial", "decided", "record-written", "sink-committed"}
	for _, ph := range append(phases, "all") {
		t.Run(ph, func(t *testing.T) {
			faults := []*fault{{phase: ph, nth: 1}, {phase: ph, nth: 2}}
			if ph == "all" { // each once, one after the other
				faults = nil
				for _, p := range phases {
					faults = append(faults, &fault{phase: p, nth: 1})
				}
			}
			c := newCluster(t, kfake.SeedTopics(3, "in"), kfake.SeedTopics(3, "out"))
			keys := produceUsers(t, c, "in", 0, 20000, 23)
			spec := kafkaSpec("eo", c, "")
			state := "file://" + t.TempDir()
			m := runKafkaJob(t, spec, state, "none", faults...)
			if m.Restarts != len(faults) {
				t.Fatalf("%d restarts, want %d", m.Restarts, len(faults))
			}
			checkCounts(t, c, "out", keys)
			checkGroupAtEnd(t, c, "counters", "in")

			keys = append(keys, produceUsers(t, c, "in", 20000, 500, 23)...)
			m = runKafkaJob(t, spec, state, "latest")
			if m.Restored == 0 {
				t.Fatal("the second run did not restore")
			}
			var in int64
			for _, s := range m.Sources {
				in += s.RecordsIn
			}
			if in != 500 {
				t.Fatalf("the restored run read %d records, want the 500 new ones", in)
			}
			checkCounts(t, c, "out", keys)
			checkGroupAtEnd(t, c, "counters", "in")
		})
	}
}

// checkGroupAtEnd checks that the sink committed the source's offsets of the final
// checkpoint (the end of the input) to group, in its transactions.
func checkGroupAtEnd(t testing.TB, c Config, group, topic string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil || ends.Error() != nil {
		t.Fatal(err, ends.Error())
	}
	got, err := adm.FetchOffsets(ctx, group)
	if err != nil || got.Error() != nil {
		t.Fatal(err, got.Error())
	}
	ends.Each(func(o kadm.ListedOffset) {
		g, ok := got.Lookup(topic, o.Partition)
		if !ok || g.At != o.Offset {
			t.Fatalf("group %s: %s/%d committed at %v (%v), want the end %d", group, topic, o.Partition, g.At, ok, o.Offset)
		}
	})
}

// TestPipelineAtLeastOnce: with mode at_least_once, every output is there after a failure,
// some twice; without failures, exactly once.
func TestPipelineAtLeastOnce(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(3, "in"), kfake.SeedTopics(3, "out"))
	keys := produceUsers(t, c, "in", 0, 2000, 11)
	runKafkaJob(t, kafkaSpec("alo", c, ", mode: at_least_once"), "file://"+t.TempDir(), "none")
	checkCounts(t, c, "out", keys)

	c2 := newCluster(t, kfake.SeedTopics(3, "in"), kfake.SeedTopics(3, "out"))
	keys = produceUsers(t, c2, "in", 0, 2000, 11)
	runKafkaJob(t, kafkaSpec("alo", c2, ", mode: at_least_once"), "file://"+t.TempDir(), "none", &fault{phase: "record-written", nth: 1})
	seen := map[string]int{}
	for _, r := range readTopic(t, c2, "out", true) {
		seen[string(r.Value)]++
	}
	want := map[string]int{}
	for _, k := range keys {
		want[k]++
		if seen[fmt.Sprintf(`{"key":%q,"count":%d}`, k, want[k])] == 0 {
			t.Fatalf("output %s #%d missing", k, want[k])
		}
	}
}

// TestPipelineSpecErrors: bad fields are reported with their paths, and an unreachable
// cluster or a missing topic fails the run with the classified error.
func TestPipelineSpecErrors(t *testing.T) {
	conns := &pipeline.Connectors{}
	Register(conns)
	sp, err := pipeline.ParseSpec([]byte(fmt.Sprintf(`
name: bad
sources: [{name: in, type: kafka, brokers: ["nohost"], topics: [in], value: xml, time_field: ts}]
operators: [{name: count, module: %s, inputs: [in], key: user}]
sinks: [{name: out, type: kafka, brokers: ["127.0.0.1:1"], topic: out, inputs: [count], sasl: {mechanism: PLAIN, username: u, password: p, password_env: X}, nope: 1}]
`, counterWasm)))
	if err != nil {
		t.Fatal(err)
	}
	err = conns.ValidateConnectors(sp, &pipeline.Env{})
	for _, want := range []string{"sources[0].brokers[0]", `"nohost" is not host:port`, "sources[0].time_field", "event_time",
		"sinks[0].sasl.password", "never goes in the spec", "sinks[0].nope"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("want %q in: %v", want, err)
		}
	}

	c := newCluster(t, kfake.SeedTopics(1, "in"), kfake.SeedTopics(1, "out"))
	// A cluster with SASL and ACLs: bob may describe "in" only.
	sc := kfake.MustCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in", "out"), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser("SCRAM-SHA-256", "admin", "adminpw"),
		kfake.User("PLAIN", "bob", "bobpw",
			kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "in", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationDescribe, Allow: true}))
	t.Cleanup(sc.Close)
	t.Setenv("CLINK_TEST_BOB_PW", "bobpw")
	t.Setenv("CLINK_TEST_WRONG_PW", "nope")
	saslSpec := func(name, pwEnv string) string {
		sp := kafkaSpec(name, Config{Brokers: sc.ListenAddrs()}, "")
		return strings.ReplaceAll(sp, "request_timeout: 10s", "request_timeout: 10s, sasl: {mechanism: PLAIN, username: bob, password_env: "+pwEnv+"}")
	}
	for _, tc := range []struct {
		name, spec string
		kind       error
		msg        string
	}{
		{"missing topic", strings.Replace(kafkaSpec("miss", c, ""), "topics: [in]", "topics: [nosuch]", 1), ErrMissingTopic, `"nosuch"`},
		{"unreachable", strings.ReplaceAll(kafkaSpec("gone", c, ""), c.Brokers[0], freePort(t)), ErrUnreachable, "unreachable"},
		{"authentication", saslSpec("authn", "CLINK_TEST_WRONG_PW"), ErrAuthentication, "authentication failed"},
		{"authorization", saslSpec("authz", "CLINK_TEST_BOB_PW"), ErrAuthorization, "authorization failed"},
		{"secret not set", saslSpec("unset", "CLINK_TEST_NOT_SET"), ErrConfig, "CLINK_TEST_NOT_SET is not set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := strings.Replace(tc.spec, "attempts: 20", "attempts: 0", 1)
			spec = strings.ReplaceAll(spec, "request_timeout: 10s", "request_timeout: 1s")
			sp, err := pipeline.ParseSpec([]byte(spec))
			if err != nil {
				t.Fatal(err)
			}
			j, err := pipeline.Start(context.Background(), sp, pipeline.Env{Connectors: conns, StateURL: "file://" + t.TempDir()})
			if err == nil {
				_, err = j.Wait()
			}
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("want %v naming %s, got %v", tc.kind, tc.msg, err)
			}
		})
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// TestPipelineHosted: RegisterHosted refuses what would reach the server's environment and
// files or another tenant's transactions, checks every broker, and runs a tenant's pipeline
// with transactional IDs of its own.
func TestPipelineHosted(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(2, "in"), kfake.SeedTopics(2, "out"))
	var asked []string
	h := Hosted{AllowBroker: func(tenant, hp string) error {
		asked = append(asked, tenant+"@"+hp)
		if hp != c.Brokers[0] {
			return fmt.Errorf("%s is not among tenant %s's allowed hosts", hp, tenant)
		}
		return nil
	}}
	conns := &pipeline.Connectors{}
	RegisterHosted(conns, h)
	bad, err := pipeline.ParseSpec(fmt.Appendf(nil, `
name: bad
tenant: acme
sources: [{name: in, type: kafka, brokers: [%q, "10.0.0.1:9092"], topics: [in], tls: {enabled: true, ca_file: /etc/passwd}}]
operators: [{name: count, module: %s, inputs: [in], key: user}]
sinks: [{name: out, type: kafka, brokers: [%q], topic: out, inputs: [count], transactional_id_prefix: other, marker_topic: m,
  sasl: {mechanism: PLAIN, username: u, password_env: AWS_SECRET_ACCESS_KEY}}]
`, c.Brokers[0], counterWasm, c.Brokers[0]))
	if err != nil {
		t.Fatal(err)
	}
	err = conns.ValidateConnectors(bad, &pipeline.Env{})
	for _, want := range []string{"sources[0].brokers[1]: 10.0.0.1:9092 is not among tenant acme's allowed hosts", "sources[0].tls: files on the server",
		"sinks[0].transactional_id_prefix: set by the server", "sinks[0].marker_topic: set by the server", "sinks[0].sasl: this server has no secret store"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("want %q in: %v", want, err)
		}
	}

	keys := produceUsers(t, c, "in", 0, 2000, 13)
	spec := strings.Replace(kafkaSpec("hosted", c, ""), "name: hosted", "name: hosted\ntenant: acme", 1)
	sp, err := pipeline.ParseSpec([]byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	j, err := pipeline.Start(context.Background(), sp, pipeline.Env{Connectors: conns, StateURL: "file://" + t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Wait(); err != nil {
		t.Fatal(err)
	}
	checkCounts(t, c, "out", keys)
	cl, err := c.newClient()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	txns, err := kadm.NewClient(cl).DescribeTransactions(context.Background(), "clink.acme.hosted.out.0.0", "clink.acme.hosted.out.1.1")
	if err != nil {
		t.Fatal(err)
	}
	for id, d := range txns {
		if d.Err != nil || d.ProducerID < 0 {
			t.Fatalf("transactional ID %s: %+v", id, d)
		}
	}
	if !slices.Contains(asked, "acme@"+c.Brokers[0]) {
		t.Fatalf("brokers checked: %v", asked)
	}
}

// TestPipelineBrokerOutage: the cluster drops every connection from the 5th produce request
// to the output on (a broker gone mid-run). Shorter than request_timeout, the pipeline rides
// it out; longer, the attempt fails with ErrUnreachable and the restart strategy restarts it
// once the cluster is back; with no restart strategy, the job fails with ErrUnreachable and a
// later --restore latest finishes it. Each time the committed output is exact.
func TestPipelineBrokerOutage(t *testing.T) {
	for _, tc := range []string{"ridden out", "restarted", "failed"} {
		t.Run(tc, func(t *testing.T) {
			kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "in"), kfake.SeedTopics(3, "out"))
			if err != nil {
				t.Fatal(err)
			}
			defer kc.Close()
			c := Config{Brokers: kc.ListenAddrs(), RequestTimeout: Duration(10 * time.Second)}
			keys := produceUsers(t, c, "in", 0, 30000, 17)
			// Ridden out: the broker drops the connections that carry produce requests for
			// 300 ms (the producer retries them within request_timeout). Dropping every
			// request instead also fails the reconnects' ApiVersions, which franz-go stops
			// retrying after a few attempts: whether 300 ms fit those attempts depended on the
			// machine's load (the other cases cover a whole broker going away).
			produceOnly := tc == "ridden out"
			var produces atomic.Int64
			var down atomic.Bool
			wentDown := make(chan struct{})
			kc.Control(func(r kmsg.Request) (kmsg.Response, error, bool) {
				kc.KeepControl()
				if r.Key() == kmsg.Produce.Int16() && produces.Add(1) == 5 {
					down.Store(true)
					close(wentDown)
				}
				if down.Load() && (!produceOnly || r.Key() == kmsg.Produce.Int16()) {
					return nil, errors.New("broker down"), true
				}
				return nil, nil, false
			})
			spec := kafkaSpec("outage", c, "")
			var restarted sync.Once
			log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
			switch tc {
			case "ridden out":
				go func() { <-wentDown; time.Sleep(300 * time.Millisecond); down.Store(false) }()
			case "restarted":
				// 3 s: a shorter request_timeout expired before the outage under -race on a
				// loaded machine, and that attempt's restart ended an outage yet to begin.
				spec = strings.ReplaceAll(spec, "request_timeout: 10s", "request_timeout: 3s")
				// The outage ends when the runtime restarts an attempt the outage failed.
				log = slog.New(slog.NewTextHandler(funcWriter(func(p []byte) {
					if strings.Contains(string(p), "restarting") && down.Load() {
						restarted.Do(func() { down.Store(false) })
					}
				}), nil))
			case "failed":
				spec = strings.ReplaceAll(spec, "request_timeout: 10s", "request_timeout: 3s")
				spec = strings.Replace(spec, "strategy: fixed-delay", "strategy: none", 1)
			}
			sp, err := pipeline.ParseSpec([]byte(spec))
			if err != nil {
				t.Fatal(err)
			}
			conns := &pipeline.Connectors{}
			Register(conns)
			state := "file://" + t.TempDir()
			j, err := pipeline.Start(context.Background(), sp, pipeline.Env{Connectors: conns, StateURL: state, Log: log})
			if err != nil {
				t.Fatal(err)
			}
			m, err := j.Wait()
			select {
			case <-wentDown:
			default:
				t.Fatalf("the outage never began: the job ended first, with restarts %d, err %v", m.Restarts, err)
			}
			switch tc {
			case "ridden out":
				if err != nil || m.Restarts != 0 {
					t.Fatalf("restarts %d, err %v: want the outage ridden out", m.Restarts, err)
				}
			case "restarted":
				if err != nil || m.Restarts == 0 {
					t.Fatalf("restarts %d, err %v: want a restart", m.Restarts, err)
				}
			case "failed":
				if !errors.Is(err, ErrUnreachable) {
					t.Fatalf("want ErrUnreachable, got %v", err)
				}
				down.Store(false)
				runKafkaJob(t, spec, state, "latest-if-any")
			}
			checkCounts(t, c, "out", keys)
		})
	}
}

type funcWriter func([]byte)

func (f funcWriter) Write(p []byte) (int, error) {
	f(p)
	return len(p), nil
}
