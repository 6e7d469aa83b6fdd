package cluster

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/clink-wasm/clink-wasm/host/state"
)

// committedCounts reads topic "out" with read_committed up to its last stable offsets (below
// which every transaction is decided) and returns each key's counts in order.
func (c *testCluster) committedCounts(t *testing.T) map[string][]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...), kgo.ConsumeTopics("out"),
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
	for p := range int32(3) {
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

// checkExactlyOnce: every key's committed outputs are exactly the counts 1..n of the model,
// each once, in order; so the final state (the last count) equals the model's.
func checkExactlyOnce(t *testing.T, got map[string][]int, want map[string]int) {
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

func addCounts(dst, src map[string]int) {
	for k, n := range src {
		dst[k] += n
	}
}

// s3OrFile returns the versitygw pool when scripts/with-s3.sh started one, else "" (a file
// pool): the protocol is the same, S3 is where it runs in production.
func s3OrFile(t *testing.T) string {
	ep := os.Getenv("CLINK_TEST_S3_ENDPOINT")
	if ep == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("the cluster tests need CLINK_TEST_S3_ENDPOINT under CI (scripts/with-s3.sh)")
		}
		return ""
	}
	return testS3URL(t)
}

// TestExactlyOnceAcrossRebalances: two workers, a third joins mid-stream, then one leaves
// mid-stream; the committed output holds each key's counts exactly once.
func TestExactlyOnceAcrossRebalances(t *testing.T) {
	c := newTestCluster(t, 6, s3OrFile(t))
	want := map[string]int{}
	a := c.startWorker(c.spec("kafka"))
	b := c.startWorker(c.spec("kafka"))
	addCounts(want, c.produce(0, 300, 20))
	waitFor(t, "two workers to share the partitions", func() bool { return c.partitioned(a, b) })
	x := c.startWorker(c.spec("kafka"))
	addCounts(want, c.produce(300, 300, 20))
	waitFor(t, "three workers to share the partitions", func() bool { return c.partitioned(a, b, x) && len(x.w.Owned()) > 0 })
	addCounts(want, c.produce(600, 300, 20))
	a.stop(t)
	addCounts(want, c.produce(900, 300, 20))
	waitFor(t, "the leaver's partitions to move", func() bool { return c.partitioned(b, x) })
	total := 0
	for _, n := range want {
		total += n
	}
	waitFor(t, "every output to be committed", func() bool {
		n := 0
		for _, g := range c.committedCounts(t) {
			n += len(g)
		}
		return n >= total
	})
	b.stop(t)
	x.stop(t)
	checkExactlyOnce(t, c.committedCounts(t), want)
	if n := len(c.eventsOf(TaskFailed)); n != 0 {
		t.Errorf("%d task failures: %v", n, c.eventsOf(TaskFailed))
	}
	c.checkLayoutObjects(t)
}

// checkLayoutObjects: every object of the pool is the cluster record or under a
// partition's hashed prefix, HH/JOB-pNNNNN/, with HH the one PartitionURL gives.
func (c *testCluster) checkLayoutObjects(t *testing.T) {
	t.Helper()
	st, err := state.Open(context.Background(), c.state)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	names, err := st.Objects("").List(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^([0-9a-f]{2})/(cnt-p(\d{5}))/`)
	perPartition := map[string]int{}
	for _, n := range names {
		if n == "cluster/cnt.json" {
			continue
		}
		m := re.FindStringSubmatch(n)
		if m == nil {
			t.Fatalf("object %q is outside the partition layout", n)
		}
		p, _ := strconv.Atoi(m[3])
		u, _ := PartitionURL("mem://x", "cnt", int32(p))
		if !strings.Contains(u, "/"+m[1]+"/") {
			t.Fatalf("object %q: partition %d hashes to %s, not %s", n, p, u, m[1])
		}
		perPartition[m[2]]++
	}
	if len(perPartition) != int(c.parts) {
		t.Fatalf("objects of %d partitions, want %d: %v", len(perPartition), c.parts, perPartition)
	}
}
