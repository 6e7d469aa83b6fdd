package cluster

import (
	"crypto/sha256"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The scale model of docs/SCALING.md: 100 workers, 10,000 partitions. It runs franz-go's own
// cooperative-sticky balancer over simulated members (so the moved partitions are the real
// balancer's), hashes the partitions onto S3 prefixes as PartitionURL does, and computes
// request and byte rates from the inputs below. CLINK_MODEL=1 prints the table.

type modelInputs struct {
	Workers, Partitions int
	Prefixes            int           // hex prefixes of PartitionURL (2 hex digits)
	Interval            time.Duration // checkpoint interval
	RecordsPerSec       float64       // input records per second per partition
	DistinctKeysPerSec  float64       // distinct keys dirtied per checkpoint interval, per second, per partition
	BytesPerEntry       int           // key + value + segment overhead per dirty entry
	// PUTs per checkpoint per partition: delta segment, lineage head CAS, manifest, prepared
	// record, committed record (+1 DELETE of the prepared record, counted apart).
	PutsPerCheckpoint int
	// GETs per restore: list + get the record, list prepared, get the head, the manifest,
	// and the segment indexes (compaction keeps a lineage to ~8 segments).
	GetsPerRestore int
	// Hand-over: group round trips (cooperative: two rebalances, join + sync each), the
	// per-task stop and start measured by BenchmarkHandover here, and the cores per worker
	// over which the tasks' starts spread.
	GroupRoundTrip      time.Duration
	HeartbeatInterval   time.Duration // members learn of a rebalance at their next heartbeat
	TaskStop, TaskStart time.Duration
	CPUPerTaskStart     time.Duration
	CoresPerWorker      int
}

type modelResult struct {
	MovedOnJoin, MovedOnLeave   int
	JoinHandover, LeaveHandover time.Duration
	PutPerPrefixMean, PutMax    float64
	GetPerPrefixOnJoin          float64
	CheckpointBytesPerSec       float64 // cluster-wide
	CheckpointBytesPerWorker    float64
}

func defaultModel() modelInputs {
	return modelInputs{
		Workers: 100, Partitions: 10000, Prefixes: 256, Interval: 10 * time.Second,
		RecordsPerSec: 1000, DistinctKeysPerSec: 300, BytesPerEntry: 64,
		PutsPerCheckpoint: 5, GetsPerRestore: 13,
		GroupRoundTrip: 5 * time.Millisecond, HeartbeatInterval: 250 * time.Millisecond, TaskStop: 50 * time.Millisecond, TaskStart: 150 * time.Millisecond,
		CPUPerTaskStart: 20 * time.Millisecond, CoresPerWorker: 4,
	}
}

// balance runs one cooperative rebalance round: members (by id) with their owned
// partitions, and returns each member's new assignment.
func balance(t *testing.T, members []string, owned map[string][]int32, partitions int, gen int32) map[string][]int32 {
	t.Helper()
	bal := kgo.CooperativeStickyBalancer()
	var ms []kmsg.JoinGroupResponseMember
	for _, id := range members {
		m := kmsg.NewJoinGroupResponseMember()
		m.MemberID = id
		m.ProtocolMetadata = bal.JoinGroupMetadata([]string{"in"}, map[string][]int32{"in": owned[id]}, gen)
		ms = append(ms, m)
	}
	mb, _, err := bal.MemberBalancer(ms)
	if err != nil {
		t.Fatal(err)
	}
	var into kgo.IntoSyncAssignment
	if be, ok := mb.(kgo.GroupMemberBalancerOrError); ok {
		if into, err = be.BalanceOrError(map[string]int32{"in": int32(partitions)}); err != nil {
			t.Fatal(err)
		}
	} else {
		into = mb.Balance(map[string]int32{"in": int32(partitions)})
	}
	out := map[string][]int32{}
	for _, a := range into.IntoSyncAssignment() {
		got, err := bal.ParseSyncAssignment(a.MemberAssignment)
		if err != nil {
			t.Fatal(err)
		}
		out[a.MemberID] = got["in"]
	}
	return out
}

// settle runs rounds until the assignment is stable (cooperative rebalancing takes two:
// the first revokes what moves, the second assigns it), returning the rounds and the
// partitions that changed owner.
func settle(t *testing.T, members []string, owned map[string][]int32, partitions int) (map[string][]int32, int, int) {
	before := map[int32]string{}
	for id, ps := range owned {
		for _, p := range ps {
			before[p] = id
		}
	}
	rounds := 0
	for gen := int32(1); ; gen++ {
		next := balance(t, members, owned, partitions, gen)
		rounds++
		same := len(next) == len(owned)
		for id := range next {
			if !slices.Equal(next[id], owned[id]) {
				same = false
			}
		}
		owned = next
		if same || rounds > 5 {
			break
		}
	}
	moved := 0
	for id, ps := range owned {
		for _, p := range ps {
			if before[p] != "" && before[p] != id {
				moved++
			}
		}
	}
	return owned, rounds, moved
}

func runModel(t *testing.T, in modelInputs) modelResult {
	var r modelResult
	var members []string
	for i := range in.Workers {
		members = append(members, fmt.Sprintf("w%03d", i))
	}
	owned, _, _ := settle(t, members, map[string][]int32{}, in.Partitions)
	// A worker joins.
	joined := append(slices.Clone(members), "w999")
	_, rounds, moved := settle(t, joined, owned, in.Partitions)
	r.MovedOnJoin = moved
	// The new worker starts its moved partitions' tasks: latency-bound per task, CPU-bound
	// over its cores; the old owners stop theirs in parallel (one or two each).
	startCPU := time.Duration(float64(in.CPUPerTaskStart) * float64(moved) / float64(in.CoresPerWorker))
	// The old members learn of the first round at their next heartbeat (on average half an
	// interval, at worst one: the model takes the worst); the second round follows the
	// revoke at once.
	r.JoinHandover = in.HeartbeatInterval + time.Duration(2*rounds)*in.GroupRoundTrip + in.TaskStop + max(in.TaskStart, startCPU)
	// A worker dies (after the session timeout, excluded): its partitions spread over the rest.
	left := members[1:]
	delete(owned, members[0])
	_, rounds, _ = settle(t, left, owned, in.Partitions)
	r.MovedOnLeave = in.Partitions / in.Workers
	perSurvivor := (r.MovedOnLeave + len(left) - 1) / len(left)
	r.LeaveHandover = in.HeartbeatInterval + time.Duration(2*rounds)*in.GroupRoundTrip + max(in.TaskStart, time.Duration(float64(in.CPUPerTaskStart)*float64(perSurvivor)/float64(in.CoresPerWorker)))
	// S3 prefixes: as PartitionURL hashes them.
	perPrefix := map[string]int{}
	for p := range in.Partitions {
		h := sha256.Sum256([]byte("job/" + strconv.Itoa(p)))
		perPrefix[fmt.Sprintf("%02x", h[0])]++
	}
	most := 0
	for _, n := range perPrefix {
		most = max(most, n)
	}
	ckPerSec := 1 / in.Interval.Seconds()
	r.PutPerPrefixMean = float64(in.Partitions) / float64(len(perPrefix)) * float64(in.PutsPerCheckpoint) * ckPerSec
	r.PutMax = float64(most) * float64(in.PutsPerCheckpoint) * ckPerSec
	// On a join, the moved partitions restore within the hand-over: their GETs land on the
	// prefixes they hash to, at most `most` partitions per prefix.
	r.GetPerPrefixOnJoin = float64(min(most, r.MovedOnJoin)*in.GetsPerRestore) / r.JoinHandover.Seconds()
	r.CheckpointBytesPerSec = float64(in.Partitions) * in.DistinctKeysPerSec * float64(in.BytesPerEntry)
	r.CheckpointBytesPerWorker = r.CheckpointBytesPerSec / float64(in.Workers)
	return r
}

// TestScaleModel: at 100 workers and 10k partitions, a join moves about 1/101 of the
// partitions (the sticky balancer's, not a reshuffle), and no S3 prefix nears its limits.
func TestScaleModel(t *testing.T) {
	in := defaultModel()
	if testing.Short() {
		in.Workers, in.Partitions = 20, 2000
	}
	r := runModel(t, in)
	fair := in.Partitions / (in.Workers + 1)
	if r.MovedOnJoin < fair-1 || r.MovedOnJoin > fair+1 {
		t.Errorf("a join moved %d partitions; the sticky balancer should move %d±1", r.MovedOnJoin, fair)
	}
	if r.PutMax >= 3500 || r.GetPerPrefixOnJoin >= 5500 {
		t.Errorf("a prefix's rates exceed S3's: %.0f PUT/s, %.0f GET/s", r.PutMax, r.GetPerPrefixOnJoin)
	}
	if os.Getenv("CLINK_MODEL") != "" {
		fmt.Printf("inputs: %+v\n", in)
		fmt.Printf("| moved on join | join hand-over | moved on death | death hand-over (after the session timeout) | PUT/s per prefix (mean, max) | GET/s per prefix during a join | checkpoint bytes/s (cluster, per worker) |\n")
		fmt.Printf("| %d | %v | %d | %v | %.1f, %.1f | %.0f | %.1f MB/s, %.2f MB/s |\n", r.MovedOnJoin, r.JoinHandover.Round(time.Millisecond),
			r.MovedOnLeave, r.LeaveHandover.Round(time.Millisecond), r.PutPerPrefixMean, r.PutMax, r.GetPerPrefixOnJoin,
			r.CheckpointBytesPerSec/1e6, r.CheckpointBytesPerWorker/1e6)
	}
}
