package cluster

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/clink-wasm/clink-wasm/host/cluster/clustertest"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// TestExactlyOnceAcrossRebalances: two workers, a third joins mid-stream, then one leaves
// mid-stream; the committed output holds each key's counts exactly once.
func TestExactlyOnceAcrossRebalances(t *testing.T) {
	c := newTestCluster(t, 6, clustertest.StateURL(t, t.TempDir()))
	want := map[string]int{}
	a := c.startWorker(c.spec("kafka"))
	b := c.startWorker(c.spec("kafka"))
	clustertest.Add(want, c.produce(0, 300, 20))
	waitFor(t, "two workers to share the partitions", func() bool { return c.partitioned(a, b) })
	x := c.startWorker(c.spec("kafka"))
	clustertest.Add(want, c.produce(300, 300, 20))
	waitFor(t, "three workers to share the partitions", func() bool { return c.partitioned(a, b, x) && len(x.w.Owned()) > 0 })
	clustertest.Add(want, c.produce(600, 300, 20))
	a.stop(t)
	clustertest.Add(want, c.produce(900, 300, 20))
	waitFor(t, "the leaver's partitions to move", func() bool { return c.partitioned(b, x) })
	total := 0
	for _, n := range want {
		total += n
	}
	waitFor(t, "every output to be committed", func() bool {
		return clustertest.Total(clustertest.CommittedCounts(t, c.brokers)) >= total
	})
	b.stop(t)
	x.stop(t)
	clustertest.CheckExactlyOnce(t, clustertest.CommittedCounts(t, c.brokers), want)
	if n := len(c.eventsOf(TaskFailed)); n != 0 {
		t.Errorf("%d task failures: %v", n, c.eventsOf(TaskFailed))
	}
	c.checkLayoutObjects(t)
	c.checkGroupOffsetsAtEnd(t, "clink.cnt")
}

// checkGroupOffsetsAtEnd: the tasks' transactions committed every partition's offsets to
// the group, up to the end of the input.
func (c *testCluster) checkGroupOffsetsAtEnd(t *testing.T, group string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	ends, err := adm.ListEndOffsets(ctx, "in")
	if err != nil {
		t.Fatal(err)
	}
	got, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		g, ok := got.Lookup("in", o.Partition)
		if !ok || g.At != o.Offset {
			t.Errorf("group %s: in/%d committed at %v (%v), want the end %d", group, o.Partition, g.At, ok, o.Offset)
		}
	})
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
