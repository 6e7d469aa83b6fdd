package cluster

import (
	"testing"

	"github.com/clink-wasm/clink-wasm/host/cluster/clustertest"
)

// TestKIP848Protocol: the same join and leave with KIP-848 groups (the broker assigns),
// exactly once; franz-go and kfake both implement it (docs/SCALING.md says why it is not
// the default).
func TestKIP848Protocol(t *testing.T) {
	c := newTestCluster(t, 4, "")
	consumer := func(o *Options) { o.Protocol = ProtocolConsumer }
	want := map[string]int{}
	a := c.startWorker(c.spec("kafka"), consumer)
	clustertest.Add(want, c.produce(0, 200, 10))
	waitFor(t, "one worker to own the partitions", func() bool { return c.partitioned(a) })
	b := c.startWorker(c.spec("kafka"), consumer)
	clustertest.Add(want, c.produce(200, 200, 10))
	waitFor(t, "two workers to share the partitions", func() bool { return c.partitioned(a, b) && len(b.w.Owned()) > 0 })
	a.stop(t)
	clustertest.Add(want, c.produce(400, 200, 10))
	waitFor(t, "the leaver's partitions to move", func() bool { return c.partitioned(b) })
	waitFor(t, "every output committed", func() bool {
		return clustertest.Total(clustertest.CommittedCounts(t, c.brokers)) >= 600
	})
	b.stop(t)
	clustertest.CheckExactlyOnce(t, clustertest.CommittedCounts(t, c.brokers), want)
}
