package kafka

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// TestRestartStress runs CLINK_KAFKA_RESTARTS rounds (none by default) of: Recover, two
// sink subtasks from the last committed epoch, three epochs with offsets, and then a clean
// stop or a crash after the last pre-commit (every other round). It is the restart pattern
// of the crash tests without their sources and manifests, some 50 times faster, written to
// hunt the OUT_OF_ORDER_SEQUENCE_NUMBER flake (see Sink.abortLost); it fails on any error.
func TestRestartStress(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("CLINK_KAFKA_RESTARTS"))
	if rounds == 0 {
		t.Skip("CLINK_KAFKA_RESTARTS not set")
	}
	c := newCluster(t, kfake.SeedTopics(3, "in"), kfake.SeedTopics(3, "out"))
	produce(t, c, "in", 10)
	ctx := context.Background()
	sc := SinkConfig{Config: c, Topic: "out"}
	last := uint64(0)
	for r := range rounds {
		if _, err := Recover(ctx, RecoverInput{Sink: sc, Job: "job", SinkName: "out", Parallelism: 2, LastCommitted: last}); err != nil {
			t.Fatalf("round %d: recover: %v", r, err)
		}
		sinks := make([]*Sink, 2)
		for i := range sinks {
			s, err := NewSink(ctx, sc, Identity{Job: "job", Sink: "out", Subtask: i, Parallelism: 2}, last+1)
			if err != nil {
				t.Fatal(err)
			}
			sinks[i] = s
		}
		func() {
			defer func() {
				for _, s := range sinks {
					s.Close()
				}
			}()
			for e := last + 1; e <= last+3; e++ {
				for i := range 30 {
					k := fmt.Sprintf("k%d", i%7)
					if err := sinks[keySubtask([]byte(k), 2)].Write(ctx, Output{Key: []byte(k), Value: []byte("v")}); err != nil {
						t.Fatal(err)
					}
				}
				for i, s := range sinks {
					m := Marker{Epoch: e, Manifest: "m"}
					if i == 0 {
						m.Group, m.Offsets = "job", Positions{{"in", 0}: int64(e), {"in", 1}: 1, {"in", 2}: 2}
					}
					if _, err := s.PreCommit(ctx, m); err != nil {
						t.Fatalf("round %d: pre-commit %d of epoch %d: %v", r, i, e, err)
					}
				}
				if r%2 == 1 && e == last+3 {
					return // crash after the pre-commit
				}
				for i, s := range sinks {
					if err := s.Commit(ctx, e); err != nil {
						t.Fatalf("round %d: commit %d of epoch %d: %v", r, i, e, err)
					}
				}
			}
		}()
		if r%2 == 1 {
			last += 2
		} else {
			last += 3
		}
	}
}
