// Package clustertest has the scale-out tests' fixtures, shared by host/cluster and the
// worker command's process tests: a kfake cluster with input and output topics, a keyed
// producer, a read_committed reader of the counter's outputs, and the exactly-once check
// against a model.
package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// OutPartitions is the output topic's partition count.
const OutPartitions = 3

// Kafka starts a kfake cluster on loopback with topics "in" (parts partitions) and "out",
// accepting session timeouts down to 100ms, and returns its brokers.
//
// CLINK_TEST_KFAKE_LOG=DIR writes the cluster's debug log to a file in DIR, one per cluster,
// named after the test (with CLINK_KAFKA_LOG=debug for the clients' side, in the workers' logs).
func Kafka(t testing.TB, parts int32) []string {
	t.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(parts, "in"), kfake.SeedTopics(OutPartitions, "out"),
		kfake.GroupMinSessionTimeout(100 * time.Millisecond),
		// KIP-848 groups: the broker sets their heartbeat and session (5s and 45s by default).
		kfake.BrokerConfigs(map[string]string{"group.consumer.heartbeat.interval.ms": "100", "group.consumer.session.timeout.ms": "1500"})}
	if dir := os.Getenv("CLINK_TEST_KFAKE_LOG"); dir != "" {
		f, err := os.CreateTemp(dir, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())+"-*.log")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		opts = append(opts, kfake.WithLogger(kfake.BasicLogger(f, kfake.LogLevelDebug)))
	}
	kf, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kf.Close)
	return kf.ListenAddrs()
}

// Produce writes n records numbered from, keyed k0..k(keys-1) round robin, with the default
// (key hash) partitioner, and returns how many records each key got.
func Produce(t testing.TB, brokers []string, from, n, keys int) map[string]int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	counts := map[string]int{}
	var recs []*kgo.Record
	for i := from; i < from+n; i++ {
		k := fmt.Sprintf("k%d", i%keys)
		counts[k]++
		recs = append(recs, &kgo.Record{Key: []byte(k), Value: fmt.Appendf(nil, `{"key":%q,"i":%d}`, k, i)})
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return counts
}

// Add adds src's counts into dst.
func Add(dst, src map[string]int) {
	for k, n := range src {
		dst[k] += n
	}
}

// CommittedCounts reads topic "out" with read_committed up to its last stable offsets (below
// which every transaction is decided) and returns each key's counts in order.
func CommittedCounts(t testing.TB, brokers []string) map[string][]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("out"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrListOffsetsRequest()
	req.IsolationLevel = 1 // read_committed: the last stable offset
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = "out"
	for p := range int32(OutPartitions) {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	ends := map[int32]int64{}
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if rp.ErrorCode != 0 {
				t.Fatalf("list offsets: %v", kerr.ErrorForCode(rp.ErrorCode))
			}
			if rp.Offset > 0 {
				ends[rp.Partition] = rp.Offset
			}
		}
	}
	got := map[string][]int{}
	next := map[int32]int64{}
	done := func() bool {
		for p, e := range ends {
			if next[p] < e {
				return false
			}
		}
		return true
	}
	for !done() {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading the output: %v (at %v, last stable %v)", ctx.Err(), next, ends)
		}
		fs.EachRecord(func(r *kgo.Record) {
			next[r.Partition] = r.Offset + 1
			if r.Attrs.IsControl() || r.Offset >= ends[r.Partition] {
				return
			}
			var v struct {
				Key   string
				Count int
			}
			if err := json.Unmarshal(r.Value, &v); err != nil {
				t.Fatalf("output %q: %v", r.Value, err)
			}
			got[v.Key] = append(got[v.Key], v.Count)
		})
	}
	return got
}

// Total is the number of outputs in got.
func Total(got map[string][]int) int {
	n := 0
	for _, g := range got {
		n += len(g)
	}
	return n
}

// CheckExactlyOnce: every key's committed outputs are exactly the counts 1..n of the model,
// each once, in order; so each key's final state (its last count) equals the model's.
func CheckExactlyOnce(t testing.TB, got map[string][]int, want map[string]int) {
	t.Helper()
	for k, n := range want {
		g := got[k]
		for i, cnt := range g {
			if cnt != i+1 {
				t.Fatalf("key %s: outputs %v, want 1..%d once each (output %d is %d)", k, g, n, i, cnt)
			}
		}
		if len(g) != n {
			t.Fatalf("key %s: %d outputs, want %d (final state %d, model %d)", k, len(g), n, len(g), n)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d keys in the output, want %d", len(got), len(want))
	}
}

// StateURL returns a fresh prefix of the versitygw server scripts/with-s3.sh started, or, when
// none runs, a file:// pool under dir (under CI=true a missing server fails the test).
func StateURL(t testing.TB, dir string) string {
	t.Helper()
	ep := os.Getenv("CLINK_TEST_S3_ENDPOINT")
	if ep == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("the cluster tests need CLINK_TEST_S3_ENDPOINT under CI (scripts/with-s3.sh)")
		}
		return "file://" + dir
	}
	u, err := url.Parse(ep)
	if err != nil || (u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost" && u.Hostname() != "::1") {
		t.Fatalf("CLINK_TEST_S3_ENDPOINT must be a loopback URL, got %q", ep)
	}
	bucket := os.Getenv("CLINK_TEST_S3_BUCKET")
	if bucket == "" {
		bucket = "clink-test"
	}
	return fmt.Sprintf("s3://%s/t/%s-%d?endpoint=%s&path_style=true", bucket,
		strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano(), url.QueryEscape(ep))
}
