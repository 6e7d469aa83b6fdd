package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// This file drives the connector through the checkpoint protocol of the pipeline runtime
// with a small coordinator of its own (the runtime's is being built elsewhere): a Kafka
// source, a keyed counter whose state goes into an in-memory manifest store, and a Kafka
// sink of one or two subtasks. It crashes the simulated process at each step of the epoch
// protocol, with faults injected around the real franz-go clients and the real (kfake)
// cluster, and checks that after recovery the committed output holds exactly one output
// per input record, in key order, and that the final state matches a model.

var errCrash = errors.New("simulated crash")

type manifest struct {
	Epoch     uint64
	Positions Positions
	Counts    map[string]int
}

// manifestStore stands for the pipeline's object store: committed manifests (latest only)
// and pending ones uploaded in step 1 of an epoch.
type manifestStore struct {
	mu      sync.Mutex
	latest  manifest
	pending map[uint64]pendingManifest
}

type pendingManifest struct {
	manifest
	name     string
	prepared []Prepared
}

func (s *manifestStore) commit(epoch uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pending[epoch]
	if !ok || epoch != s.latest.Epoch+1 {
		panic(fmt.Sprintf("commit of manifest %d: pending %v, latest %d", epoch, ok, s.latest.Epoch))
	}
	s.latest = p.manifest
	delete(s.pending, epoch)
}

type crashPoint struct {
	epoch   uint64
	point   string
	subtask int
}

type job struct {
	kc      *kfake.Cluster
	trace   *traceLog // with CLINK_KAFKA_TRACE
	c       Config
	total   int
	sinks   int
	every   int
	st      *manifestStore
	sinkCfg func(Config) SinkConfig
}

func newJob(t testing.TB, partitions int32, total, sinks, every int) *job {
	kc, c := newKfake(t, kfake.SeedTopics(partitions, "in"), kfake.SeedTopics(3, "out"))
	produce(t, c, "in", total)
	return &job{kc: kc, trace: traceOf(kc), c: c, total: total, sinks: sinks, every: every,
		st:      &manifestStore{pending: map[uint64]pendingManifest{}, latest: manifest{Counts: map[string]int{}}},
		sinkCfg: func(c Config) SinkConfig { return SinkConfig{Config: c, Topic: "out"} }}
}

func keySubtask(k []byte, n int) int {
	h := fnv.New32a()
	h.Write(k)
	return int(h.Sum32() % uint32(n))
}

// run is one process: recover, restore, process until the input is done or the crash
// point fires (errCrash), or until after the manifest of stopAfter (a clean stop).
func (j *job) run(t testing.TB, cp *crashPoint, stopAfter uint64, during func(*netFaults, uint64)) (err error) {
	ctx, f := newProcess(t)
	cfg := f.config(j.c)
	sc := j.sinkCfg(cfg)

	j.st.mu.Lock()
	last := j.st.latest
	var pend *PendingEpoch
	if p, ok := j.st.pending[last.Epoch+1]; ok {
		pend = &PendingEpoch{Epoch: p.Epoch, Manifest: p.name, Prepared: p.prepared}
	}
	j.st.mu.Unlock()
	d, err := Recover(ctx, RecoverInput{Sink: sc, Job: "job", SinkName: "out", Parallelism: j.sinks, LastCommitted: last.Epoch, Pending: pend})
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	if d.RollForward {
		if d.Manifest != pend.Manifest {
			t.Fatalf("marker names manifest %q, pending is %q", d.Manifest, pend.Manifest)
		}
		j.st.commit(d.Epoch)
		j.st.mu.Lock()
		last = j.st.latest
		j.st.mu.Unlock()
	}

	src, err := NewSource(SourceConfig{Config: cfg, Topics: []string{"in"}, KeyField: "k"})
	if err != nil {
		return err
	}
	defer src.Close()
	splits, err := src.Splits(ctx)
	if err != nil {
		return err
	}
	if err := src.Open(ctx, splits, last.Positions); err != nil {
		return err
	}
	sinks := make([]*Sink, j.sinks)
	defer func() {
		for _, s := range sinks {
			if s != nil {
				s.Close()
			}
		}
	}()
	for i := range sinks {
		if sinks[i], err = NewSink(ctx, sc, Identity{Job: "job", Sink: "out", Subtask: i, Parallelism: j.sinks}, last.Epoch+1); err != nil {
			return err
		}
	}
	counts := maps.Clone(last.Counts)
	epoch, n := last.Epoch+1, 0
	hit := func(point string) bool {
		return cp != nil && cp.epoch == epoch && cp.point == point
	}
	crash := func() error {
		f.kill()
		return errCrash
	}
	done := func() bool {
		sum := int64(0)
		for _, v := range src.Positions() {
			sum += v
		}
		return sum == int64(j.total)
	}
	for {
		fin := done()
		if fin && n == 0 {
			return nil
		}
		if !fin {
			recs, err := src.Poll(ctx, 50*time.Millisecond, j.every-n)
			if err != nil {
				return err
			}
			for _, r := range recs {
				if r.Err != nil {
					t.Fatalf("record %v@%d: %v", r.Split, r.Offset, r.Err)
				}
				k := string(r.Key)
				counts[k]++
				v, _ := json.Marshal(map[string]any{"k": k, "c": counts[k], "src": r.Split.String() + "@" + strconv.FormatInt(r.Offset, 10)})
				if err := sinks[keySubtask(r.Key, j.sinks)].Write(ctx, Output{Key: r.Key, Value: v}); err != nil {
					return err
				}
				n++
				if n == j.every/2 {
					if during != nil {
						during(f, epoch)
					}
					if hit("mid-epoch") {
						return crash()
					}
				}
			}
		}
		if n < j.every && !done() {
			continue
		}
		// Barrier: step 0, pre-commit every sink.
		pos := src.Positions()
		name := fmt.Sprintf("manifest-%d", epoch)
		var prepared []Prepared
		for i, s := range sinks {
			m := Marker{Epoch: epoch, Manifest: name}
			if i == 0 {
				m.Group, m.Offsets = "job", pos
			}
			p, err := s.PreCommit(ctx, m)
			if err != nil {
				return fmt.Errorf("pre-commit %d of epoch %d: %w", i, epoch, err)
			}
			prepared = append(prepared, p)
		}
		if hit("after-precommit") {
			return crash()
		}
		// Step 1: the state delta and the pending manifest are durable.
		j.st.mu.Lock()
		j.st.pending[epoch] = pendingManifest{manifest{epoch, pos, maps.Clone(counts)}, name, prepared}
		j.st.mu.Unlock()
		if hit("after-upload") {
			return crash()
		}
		// Step 2: the Kafka transactions.
		for i, s := range sinks {
			if i == 1 && hit("between-sinks") {
				return crash()
			}
			if cp != nil && cp.epoch == epoch && cp.subtask == i && (cp.point == "endtxn-drop" || cp.point == "endtxn-deliver") {
				fired := f.armEndTxn(cp.point[len("endtxn-"):])
				err := s.Commit(ctx, epoch)
				<-fired
				if err == nil {
					t.Fatalf("commit succeeded through a dead network")
				}
				return errCrash
			}
			if err := s.Commit(ctx, epoch); err != nil {
				return fmt.Errorf("commit %d of epoch %d: %w", i, epoch, err)
			}
		}
		if hit("before-manifest") {
			return crash()
		}
		// Step 3: the manifest.
		j.st.commit(epoch)
		if hit("after-manifest") {
			return crash()
		}
		if epoch == stopAfter {
			return nil
		}
		epoch, n = epoch+1, 0
	}
}

// runRestarting is run under a restart strategy, as the pipeline runtime runs an attempt:
// an attempt that fails with the retryable ErrTransactionAborted (a write of the epoch
// refused with OUT_OF_ORDER_SEQUENCE_NUMBER, see Sink.abortLost) is restarted from the last
// checkpoint, at most 3 times, and said in the log (with the trace, if CLINK_KAFKA_TRACE is
// set). Every other outcome is returned.
func (j *job) runRestarting(t testing.TB, cp *crashPoint, stopAfter uint64, during func(*netFaults, uint64)) error {
	for restarts := 0; ; restarts++ {
		err := j.run(t, cp, stopAfter, during)
		if restarts == 3 || !errors.Is(err, ErrTransactionAborted) || !IsRetryable(err) {
			return err
		}
		t.Logf("restarting from manifest %d after: %v", j.st.latest.Epoch, err)
		if l := j.trace; l != nil {
			t.Log(l)
		}
	}
}

// verify checks the committed output and the final state against a model of the input.
func (j *job) verify(t testing.TB) {
	t.Helper()
	model := map[string]int{}
	for i := range j.total {
		model[fmt.Sprintf("k%d", i%7)]++
	}
	seen := map[string]bool{}
	next := map[string]int{}
	for _, r := range readTopic(t, j.c, "out", true) {
		var o struct {
			K   string
			C   int
			Src string
		}
		if err := json.Unmarshal(r.Value, &o); err != nil {
			t.Fatalf("output %q: %v", r.Value, err)
		}
		if seen[o.Src] {
			t.Fatalf("input %s has two outputs", o.Src)
		}
		seen[o.Src] = true
		next[o.K]++
		if o.C != next[o.K] {
			t.Fatalf("key %s: output count %d where %d comes next", o.K, o.C, next[o.K])
		}
	}
	if len(seen) != j.total {
		t.Fatalf("%d inputs have an output, want %d", len(seen), j.total)
	}
	if !maps.Equal(next, model) || !maps.Equal(j.st.latest.Counts, model) {
		t.Fatalf("outputs per key %v, final state %v, model %v", next, j.st.latest.Counts, model)
	}
	// The group's offsets, committed inside the transactions, are the last manifest's.
	admc, err := kgo.NewClient(kgo.SeedBrokers(j.c.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer admc.Close()
	offs, err := kadm.NewClient(admc).FetchOffsets(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	for sp, want := range j.st.latest.Positions {
		if o, ok := offs.Lookup(sp.Topic, sp.Partition); !ok || o.At != want {
			t.Fatalf("group offset of %v: %+v (%v), manifest has %d", sp, o, ok, want)
		}
	}
}

// TestRecoverRefuses: a marker of epoch n without a pending manifest is ErrInvariant; a
// committed epoch whose other transaction was aborted meanwhile (as the transaction timeout
// would) is ErrPartialCommit, not a silent choice.
func TestRecoverRefuses(t *testing.T) {
	j := newJob(t, 2, 80, 1, 20)
	if err := j.run(t, &crashPoint{epoch: 2, point: "before-manifest"}, 0, nil); !errors.Is(err, errCrash) {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err := Recover(ctx, RecoverInput{Sink: j.sinkCfg(j.c), Job: "job", SinkName: "out", Parallelism: 1, LastCommitted: 1})
	if !errors.Is(err, ErrInvariant) {
		t.Fatalf("marker without pending manifest: %v, want ErrInvariant", err)
	}

	j = newJob(t, 2, 80, 2, 20)
	if err := j.run(t, &crashPoint{epoch: 2, point: "between-sinks"}, 0, nil); !errors.Is(err, errCrash) {
		t.Fatal(err)
	}
	admc, err := kgo.NewClient(kgo.SeedBrokers(j.c.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer admc.Close()
	p := j.st.pending[2]
	for _, pr := range p.prepared {
		if pr.Subtask == 1 {
			if err := fence(ctx, admc, j.sinkCfg(j.c), pr.TransactionalID); err != nil {
				t.Fatal(err)
			}
		}
	}
	_, err = Recover(ctx, RecoverInput{Sink: j.sinkCfg(j.c), Job: "job", SinkName: "out", Parallelism: 2, LastCommitted: 1,
		Pending: &PendingEpoch{Epoch: 2, Manifest: p.name, Prepared: p.prepared}})
	if !errors.Is(err, ErrPartialCommit) {
		t.Fatalf("one of two transactions aborted: %v, want ErrPartialCommit", err)
	}
}

var crashPoints = []string{"mid-epoch", "after-precommit", "after-upload", "endtxn-drop", "endtxn-deliver", "before-manifest", "after-manifest"}

// TestCrashPoints crashes at each step of an epoch (and, with two sink subtasks, between
// their commits and in each one's EndTxn), then runs the job again and verifies it.
func TestCrashPoints(t *testing.T) {
	for _, sinks := range []int{1, 2} {
		points := crashPoints
		if sinks == 2 {
			points = append(points, "between-sinks")
		}
		for _, p := range points {
			for sub := range sinks {
				if sub > 0 && p != "endtxn-drop" && p != "endtxn-deliver" {
					continue
				}
				t.Run(fmt.Sprintf("sinks=%d/%s/%d", sinks, p, sub), func(t *testing.T) {
					t.Parallel()
					j := newJob(t, 3, 150, sinks, 40)
					if err := j.runRestarting(t, &crashPoint{epoch: 2, point: p, subtask: sub}, 0, nil); !errors.Is(err, errCrash) {
						t.Fatalf("first run: %v, want the crash", err)
					}
					if err := j.runRestarting(t, nil, 0, nil); err != nil {
						t.Fatalf("after the crash: %v", err)
					}
					j.verify(t)
				})
			}
		}
	}
}

// TestInDoubtCommitDecides: an EndTxn that reached the broker rolls epoch n forward; one
// that never did rolls back to n-1. Checked on the decision itself, not only on the output.
func TestInDoubtCommitDecides(t *testing.T) {
	for _, how := range []string{"endtxn-deliver", "endtxn-drop"} {
		j := newJob(t, 2, 60, 1, 20)
		if err := j.run(t, &crashPoint{epoch: 2, point: how}, 0, nil); !errors.Is(err, errCrash) {
			t.Fatal(err)
		}
		ctx, f := newProcess(t)
		p := j.st.pending[2]
		d, err := Recover(ctx, RecoverInput{Sink: j.sinkCfg(f.config(j.c)), Job: "job", SinkName: "out", Parallelism: 1, LastCommitted: 1,
			Pending: &PendingEpoch{Epoch: 2, Manifest: p.name, Prepared: p.prepared}})
		if err != nil {
			t.Fatal(err)
		}
		if want := how == "endtxn-deliver"; d.RollForward != want || (want && d.Epoch != 2) || (!want && d.Epoch != 1) {
			t.Fatalf("%s: decision %+v", how, d)
		}
	}
}

// TestResumeAfterCleanStop: a process stops cleanly after epoch 2; the next one resumes from
// the manifest's offsets (not the group's) and the output is exact.
func TestResumeAfterCleanStop(t *testing.T) {
	j := newJob(t, 3, 150, 2, 30)
	if err := j.runRestarting(t, nil, 2, nil); err != nil {
		t.Fatal(err)
	}
	if j.st.latest.Epoch != 2 {
		t.Fatalf("stopped at manifest %d", j.st.latest.Epoch)
	}
	if err := j.runRestarting(t, nil, 0, nil); err != nil {
		t.Fatal(err)
	}
	j.verify(t)
}

// TestBrokerGoesAway: the network to the cluster goes down mid-epoch. With the default
// request timeout the clients ride it out (it comes back after a few refused dials) and the
// run finishes; with a short one the run fails with ErrUnreachable, and the next run,
// recovering, finishes exactly.
func TestBrokerGoesAway(t *testing.T) {
	t.Run("retry", func(t *testing.T) {
		j := newJob(t, 2, 100, 1, 25)
		went := false
		err := j.run(t, nil, 0, func(f *netFaults, epoch uint64) {
			if epoch == 2 {
				f.goAway(3)
				went = true
			}
		})
		if err != nil || !went {
			t.Fatalf("run through the outage: %v (went away: %v)", err, went)
		}
		j.verify(t)
	})
	t.Run("fail", func(t *testing.T) {
		j := newJob(t, 2, 100, 1, 25)
		j.sinkCfg = func(c Config) SinkConfig {
			c.RequestTimeout = Duration(300 * time.Millisecond)
			return SinkConfig{Config: c, Topic: "out"}
		}
		err := j.run(t, nil, 0, func(f *netFaults, epoch uint64) {
			if epoch == 2 {
				f.goAway(0)
			}
		})
		if !errors.Is(err, ErrUnreachable) || !IsRetryable(err) {
			t.Fatalf("run into a lasting outage: %v, want a retryable ErrUnreachable", err)
		}
		j.sinkCfg = func(c Config) SinkConfig { return SinkConfig{Config: c, Topic: "out"} }
		// A restarted run, under the restart strategy (it can meet the franz-go sequence bug).
		if err := j.runRestarting(t, nil, 0, nil); err != nil {
			t.Fatal(err)
		}
		j.verify(t)
	})
}

// TestCrashSoak crashes at random points over many seeds: CLINK_KAFKA_SOAK=N runs N (make
// soak); the default run does none.
func TestCrashSoak(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("CLINK_KAFKA_SOAK"))
	if runs == 0 {
		t.Skip("CLINK_KAFKA_SOAK not set")
	}
	for seed := range runs {
		rng := rand.New(rand.NewPCG(uint64(seed), 1))
		sinks := 1 + rng.IntN(2)
		j := newJob(t, 3, 200, sinks, 20+rng.IntN(30))
		for crashes := 0; ; crashes++ {
			var cp *crashPoint
			if crashes < 3 {
				points := crashPoints
				if sinks == 2 {
					points = append(points, "between-sinks")
				}
				cp = &crashPoint{epoch: j.st.latest.Epoch + 1 + uint64(rng.IntN(3)), point: points[rng.IntN(len(points))], subtask: rng.IntN(sinks)}
			}
			err := j.runRestarting(t, cp, 0, nil)
			if err == nil {
				break
			}
			if !errors.Is(err, errCrash) {
				t.Fatalf("seed %d: %v", seed, err)
			}
		}
		j.verify(t)
	}
}

// refuseProduce makes the cluster refuse the next produce request that writes to topic (to
// the marker topic if topic is "") with OUT_OF_ORDER_SEQUENCE_NUMBER, without
// appending it (what the flake of the crash tests did to a marker: see Sink.abortLost). It
// returns a channel closed when it fired.
//
// It refuses a write to any partition of the topic: the input and output topics share a
// partition count and a partitioner, so the outputs of one input partition all go to one
// output partition, and an input partition read to its end early writes no more to it.
func (j *job) refuseProduce(t testing.TB, topic string) <-chan struct{} {
	t.Helper()
	admc, err := kgo.NewClient(kgo.SeedBrokers(j.c.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer admc.Close()
	if topic == "" {
		topic = j.sinkCfg(j.c).markerTopic(Identity{Job: "job", Sink: "out"})
	}
	md, err := kadm.NewClient(admc).Metadata(context.Background(), topic)
	if err != nil || md.Topics[topic].Err != nil {
		t.Fatalf("topic %s: %v %v", topic, err, md.Topics[topic].Err)
	}
	id := md.Topics[topic].ID
	fired := make(chan struct{})
	j.kc.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.ProduceRequest)
		hit := false
		for _, rt := range req.Topics {
			hit = hit || (rt.Topic == topic || rt.TopicID == id) && len(rt.Partitions) > 0
		}
		if !hit {
			j.kc.KeepControl()
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		resp.Version = req.Version
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.OutOfOrderSequenceNumber.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		close(fired)
		j.kc.DropControl() // once: KeepControl above marked it kept
		return resp, nil, true
	})
	return fired
}

// TestMarkerRefused: the cluster refuses an epoch's marker (or one of its outputs) with
// OUT_OF_ORDER_SEQUENCE_NUMBER (the flake this handling exists for). PreCommit (or Write)
// fails with a retryable ErrTransactionAborted, the epoch's transaction is aborted at once
// (read_committed consumers are not held up by it and see none of it), and the next run
// (the runtime's restart) writes the epoch again: the output is exact.
func TestMarkerRefused(t *testing.T) {
	for _, sinks := range []int{1, 2} {
		for _, what := range []string{"marker", "output"} {
			t.Run(fmt.Sprintf("sinks=%d/%s", sinks, what), func(t *testing.T) {
				t.Parallel()
				j := newJob(t, 3, 150, sinks, 40)
				topic := ""
				if what == "output" {
					topic = "out"
				}
				var fired <-chan struct{}
				err := j.run(t, nil, 0, func(_ *netFaults, epoch uint64) {
					if epoch == 2 {
						fired = j.refuseProduce(t, topic)
					}
				})
				if !errors.Is(err, ErrTransactionAborted) || !IsRetryable(err) || !errors.Is(err, kerr.OutOfOrderSequenceNumber) {
					t.Fatalf("run with a refused %s: %v, want a retryable ErrTransactionAborted", what, err)
				}
				<-fired
				if j.st.latest.Epoch != 1 {
					t.Fatalf("last manifest %d, want 1", j.st.latest.Epoch)
				}
				if sinks == 1 {
					// The only open transaction was the refused one: aborted now, the
					// output reads to its end with read_committed and holds epoch 1 only.
					if n := len(readTopic(t, j.c, "out", true)); n != 40 {
						t.Fatalf("%d committed outputs after the refused epoch, want epoch 1's 40", n)
					}
				}
				// The restart runs under the restart strategy: it can meet the franz-go
				// sequence bug itself (a restarted run's second transaction), as every
				// crash test's restart can.
				if err := j.runRestarting(t, nil, 0, nil); err != nil {
					t.Fatalf("restart: %v", err)
				}
				j.verify(t)
			})
		}
	}
}
