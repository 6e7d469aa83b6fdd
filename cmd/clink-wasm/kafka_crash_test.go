package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestKafkaPipelineCrash runs Kafka → counter → Kafka, exactly once, through the real CLI
// (this test binary as clink-wasm) against a kfake cluster on loopback in the test process.
// Each round SIGKILLs the first runs at random moments or at a commit phase: after the
// acknowledgements, after the prepared record, in the middle of the transaction commits (one
// subtask's committed), after the decision and before the record, after the record. Then
// the same command with --restore latest, until a run finishes. The output topic, read with
// read_committed, must hold each key's counts 1..n once, in order, and the state of the final
// checkpoint must match the model.
func TestKafkaPipelineCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	rounds, minKills := 4, 5
	if os.Getenv("CLINK_KAFKA_SOAK") != "" {
		rounds, minKills = 40, 50
	}
	wasm, err := filepath.Abs("../../examples/wasm/counter/counter-as.wasm")
	if err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	kills := 0
	for round := range rounds {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			kills += kafkaCrashRound(t, wasm, cache, uint64(round)*7919+1)
		})
	}
	t.Logf("%d SIGKILLs", kills)
	if kills < minKills {
		t.Fatalf("only %d kill points", kills)
	}
}

func kafkaCrashRound(t *testing.T, wasm, cache string, seed uint64) int {
	rng := rand.New(rand.NewPCG(seed, 13))
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "in"), kfake.SeedTopics(3, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	keys := produceKafkaInput(t, brokers, 40000+rng.IntN(20000), 300, seed)

	dir := t.TempDir()
	bj, _ := json.Marshal(brokers)
	specPath := filepath.Join(dir, "spec.yaml")
	spec := fmt.Sprintf(`
name: kcrash
checkpoints: {interval: 10ms}
sources:
  - {name: in, type: kafka, brokers: %s, topics: [in], stop_at: latest, parallelism: 2}
operators:
  - {name: count, module: %s, inputs: [in], key: user, parallelism: 2}
sinks:
  - {name: out, type: kafka, brokers: %s, topic: out, inputs: [count], parallelism: 2}
`, bj, wasm, bj)
	if err := os.WriteFile(specPath, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	stateURL := "file://" + filepath.Join(dir, "state")
	phases := []string{"acknowledged", "prepared", "decide-partial", "decided", "record-written"}
	kills := 0
	var how []string
	defer func() { t.Logf("killed: %v", how) }()
	restore := "none"
	for attempt := 0; ; attempt++ {
		if attempt > 12 {
			t.Fatal("no successful run after 12 attempts")
		}
		args := []string{"run", "--pipeline", specPath, "--state", stateURL, "--restore", restore, "--quiet"}
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), "CLINK_CLI_CHILD=1", "XDG_CACHE_HOME="+cache)
		var killAfter time.Duration
		kill := ""
		if attempt < 3 { // the first runs are killed: at a commit phase, or at a random moment
			if rng.IntN(3) != 0 {
				kill = fmt.Sprintf("%s:%d", phases[rng.IntN(len(phases))], 1+rng.IntN(2))
				cmd.Env = append(cmd.Env, "CLINK_TEST_KILL_AT="+kill)
			} else {
				killAfter = time.Duration(rng.IntN(150)+1) * time.Millisecond
				kill = killAfter.String()
			}
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		killed, err := runKillable(t, cmd, killAfter)
		if err == nil {
			break
		}
		if killed {
			kills++
			how = append(how, kill)
			restore = "latest"
			if rng.IntN(2) == 0 {
				restore = "if-any"
			}
			continue
		}
		if strings.Contains(stderr.String(), "no checkpoint to restore") && restore == "latest" {
			restore = "none" // killed before the first checkpoint: run the first command again
			continue
		}
		t.Fatalf("run %d (%v): %v\n%s", attempt, args, err, stderr.String())
	}
	want, st := counterModel(keys)
	checkKafkaOutput(t, brokers, "out", want)
	checkState(t, filepath.Join(dir, "state"), []map[string]int64{st})
	return kills
}

// produceKafkaInput writes n records {"user","seq"}, keyed by user, and returns the users in
// order. A key's records all go to one partition, so the counter sees them in this order.
func produceKafkaInput(t *testing.T, brokers []string, n, users int, seed uint64) []string {
	r := rand.New(rand.NewPCG(seed, 7))
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	keys := make([]string, n)
	recs := make([]*kgo.Record, n)
	for i := range n {
		u := fmt.Sprintf("u%03d", r.IntN(users))
		if r.IntN(10) == 0 {
			u = "hot"
		}
		keys[i] = u
		recs[i] = &kgo.Record{Key: []byte(u), Value: fmt.Appendf(nil, `{"user":%q,"seq":%d}`, u, i)}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// checkKafkaOutput reads topic with read_committed to its end and compares it with the
// model: per key, the same outputs in the same order.
func checkKafkaOutput(t *testing.T, brokers []string, topic string, want map[string][]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	adm, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	ends, err := kadm.NewClient(adm).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[string][]string{}
	n := 0
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s: still waiting for %v", topic, left)
		}
		for r := range fs.RecordsAll() {
			if r.Offset+1 >= left[r.Partition] {
				delete(left, r.Partition)
			}
			if r.Attrs.IsControl() {
				continue
			}
			var v struct{ Key string }
			if err := json.Unmarshal(r.Value, &v); err != nil {
				t.Fatalf("output %q is not JSON", r.Value)
			}
			got[v.Key] = append(got[v.Key], string(r.Value))
			n++
		}
	}
	total := 0
	for k, w := range want {
		total += len(w)
		g := got[k]
		if len(g) != len(w) || firstDiff(g, w) != len(w) {
			t.Fatalf("key %q: %d outputs, want %d; first difference at %d", k, len(g), len(w), firstDiff(g, w))
		}
	}
	if n != total {
		t.Fatalf("%d committed outputs, want %d", n, total)
	}
}
