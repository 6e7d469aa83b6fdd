package kafka

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kfake"
)

// DefaultDevPort is the port `clink-wasm dev kafka` listens on unless told otherwise: the
// usual Kafka port, so that examples can say 127.0.0.1:9092.
const DefaultDevPort = 9092

// TopicSpec is a topic to create in a dev cluster.
type TopicSpec struct {
	Name       string
	Partitions int32
}

var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// ParseTopicSpec parses "name:partitions" (or just "name", one partition).
func ParseTopicSpec(s string) (TopicSpec, error) {
	name, parts, has := strings.Cut(s, ":")
	ts := TopicSpec{Name: name, Partitions: 1}
	if !topicName.MatchString(name) || name == "." || name == ".." {
		return ts, fmt.Errorf("topic %q: a name is 1 to 249 of [a-zA-Z0-9._-]", name)
	}
	if has {
		n, err := strconv.ParseInt(parts, 10, 32)
		if err != nil || n < 1 || n > 10000 {
			return ts, fmt.Errorf("topic %q: partitions %q must be a number from 1 to 10000", name, parts)
		}
		ts.Partitions = int32(n)
	}
	return ts, nil
}

// DevOptions configures a dev cluster.
type DevOptions struct {
	Port    int // 0 picks a free port; the cluster always listens on 127.0.0.1
	Brokers int // 0 means 1; with several, ports are Port, Port+1, ... (free ones if Port is 0)
	Topics  []TopicSpec
	// DataDir, if set, keeps the cluster's data across restarts of the dev cluster.
	DataDir string
}

// Dev is an in-process Kafka cluster (franz-go's kfake) on loopback, with transactions,
// consumer groups and read_committed, for trying pipelines on one machine and for tests.
type Dev struct {
	c *kfake.Cluster
}

// StartDev starts a dev cluster.
func StartDev(o DevOptions) (*Dev, error) {
	n := max(o.Brokers, 1)
	opts := []kfake.Opt{kfake.NumBrokers(n), kfake.ClusterID("clink-dev")}
	if o.Port != 0 {
		ports := make([]int, n)
		for i := range ports {
			ports[i] = o.Port + i
		}
		opts = append(opts, kfake.Ports(ports...))
	}
	seen := map[string]bool{}
	for _, t := range o.Topics {
		if seen[t.Name] {
			return nil, fmt.Errorf("topic %q given twice", t.Name)
		}
		seen[t.Name] = true
		opts = append(opts, kfake.SeedTopics(t.Partitions, t.Name))
	}
	if o.DataDir != "" {
		opts = append(opts, kfake.DataDir(o.DataDir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("start dev kafka on 127.0.0.1:%d: %w", o.Port, err)
	}
	return &Dev{c: c}, nil
}

// Brokers returns the cluster's listen addresses, to put in a spec's brokers list.
func (d *Dev) Brokers() []string { return d.c.ListenAddrs() }

// Cluster returns the kfake cluster, for tests that inject faults or move partitions.
func (d *Dev) Cluster() *kfake.Cluster { return d.c }

// Close stops the cluster.
func (d *Dev) Close() { d.c.Close() }
