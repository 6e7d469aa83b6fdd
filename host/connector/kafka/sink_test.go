package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func writeN(t testing.TB, ctx context.Context, s *Sink, epoch uint64, n int) {
	t.Helper()
	for i := range n {
		if err := s.Write(ctx, Output{Key: []byte(fmt.Sprint(i % 5)), Value: []byte(fmt.Sprintf("e%d-%d", epoch, i))}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSinkExactlyOnce: epoch 1 committed, epoch 2 pre-committed only, epoch 3 written only.
// read_committed sees epoch 1 alone; read_uncommitted sees the others too (so they were
// written and hidden, not lost); the marker of epoch 1 is committed, and the group got the
// offsets of epoch 1 through the transaction, not those of epoch 2.
func TestSinkExactlyOnce(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(3, "out"), kfake.SeedTopics(1, "in"))
	ctx := context.Background()
	id := Identity{Job: "j", Sink: "s", Subtask: 0, Parallelism: 1}
	sc := SinkConfig{Config: c, Topic: "out"}
	s, err := NewSink(ctx, sc, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	writeN(t, ctx, s, 1, 10)
	p1, err := s.PreCommit(ctx, Marker{Epoch: 1, Manifest: "m1", Group: "g", Offsets: Positions{{"in", 0}: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if p1.TransactionalID != id.TransactionalID(1) || p1.ProducerID < 0 {
		t.Fatalf("prepared %+v", p1)
	}
	writeN(t, ctx, s, 2, 7) // epoch 2, on the other slot, while epoch 1 is not yet committed
	if err := s.Commit(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PreCommit(ctx, Marker{Epoch: 2, Manifest: "m2", Group: "g", Offsets: Positions{{"in", 0}: 17}}); err != nil {
		t.Fatal(err)
	}
	writeN(t, ctx, s, 3, 4)
	s.Close()

	d, err := Recover(ctx, RecoverInput{Sink: sc, Job: "j", SinkName: "s", Parallelism: 1, LastCommitted: 1})
	if err != nil || d.RollForward || d.Epoch != 1 {
		t.Fatalf("decision %+v, %v", d, err)
	}
	if got := len(readTopic(t, c, "out", true)); got != 10 {
		t.Fatalf("read_committed: %d records, want 10", got)
	}
	// Epoch 2 was flushed by its PreCommit; epoch 3's records may or may not have left the
	// producer's buffer before Close.
	if got := len(readTopic(t, c, "out", false)); got < 17 || got > 21 {
		t.Fatalf("read_uncommitted: %d records, want 17 to 21", got)
	}
	admc, _ := kgo.NewClient(kgo.SeedBrokers(c.Brokers...))
	defer admc.Close()
	m, ok, err := lastMarker(ctx, admc, c, sc.markerTopic(id), id)
	if err != nil || !ok || m.Epoch != 1 || m.Manifest != "m1" {
		t.Fatalf("last marker %+v %v %v", m, ok, err)
	}
	offs, err := kadm.NewClient(admc).FetchOffsets(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offs.Lookup("in", 0); !ok || o.At != 10 {
		t.Fatalf("group offset %+v %v, want 10", o, ok)
	}

	// The next incarnation carries on at epoch 2; the old one is fenced.
	s2, err := NewSink(ctx, sc, id, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	writeN(t, ctx, s2, 2, 3)
	if _, err := s2.PreCommit(ctx, Marker{Epoch: 2, Manifest: "m2"}); err != nil {
		t.Fatal(err)
	}
	if err := s2.Commit(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if got := len(readTopic(t, c, "out", true)); got != 13 {
		t.Fatalf("read_committed after epoch 2: %d records, want 13", got)
	}
	if _, err := s2.PreCommit(ctx, Marker{Epoch: 2}); err == nil {
		t.Fatal("PreCommit of an epoch already pre-committed accepted")
	}
	// A later epoch than the next one is fine (a pipeline's checkpoint ids jump between
	// attempts); Commit names it.
	writeN(t, ctx, s2, 5, 2)
	if _, err := s2.PreCommit(ctx, Marker{Epoch: 5, Manifest: "m5"}); err != nil {
		t.Fatal(err)
	}
	if err := s2.Commit(ctx, 4); err == nil {
		t.Fatal("Commit of an epoch not pre-committed accepted")
	}
	if err := s2.Commit(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if got := len(readTopic(t, c, "out", true)); got != 15 {
		t.Fatalf("read_committed after epoch 5: %d records, want 15", got)
	}
}

// TestSinkFencesZombie: a second incarnation of the same subtask fences the first, whose
// commit then fails with ErrFenced and whose outputs stay invisible.
func TestSinkFencesZombie(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "out"))
	ctx := context.Background()
	id := Identity{Job: "j", Sink: "s"}
	sc := SinkConfig{Config: c, Topic: "out"}
	zombie, err := NewSink(ctx, sc, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer zombie.Close()
	writeN(t, ctx, zombie, 1, 5)
	if _, err := zombie.PreCommit(ctx, Marker{Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	fresh, err := NewSink(ctx, sc, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	// Kafka answers PRODUCER_FENCED; kfake, seeing an epoch one behind, INVALID_TXN_STATE.
	if err := zombie.Commit(ctx, 1); !errors.Is(err, ErrFenced) && !errors.Is(err, kerr.InvalidTxnState) {
		t.Fatalf("zombie commit: %v, want ErrFenced", err)
	}
	if got := len(readTopic(t, c, "out", true)); got != 0 {
		t.Fatalf("the zombie's outputs are visible: %d", got)
	}
}

// TestSinkAtLeastOnce: outputs are visible as soon as PreCommit flushed; after a restart
// from epoch 1 the outputs of epoch 2 are written again (the documented duplicates).
func TestSinkAtLeastOnce(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "out"))
	ctx := context.Background()
	id := Identity{Job: "j", Sink: "s"}
	sc := SinkConfig{Config: c, Topic: "out", Mode: AtLeastOnce}
	s, err := NewSink(ctx, sc, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	writeN(t, ctx, s, 1, 4)
	if p, err := s.PreCommit(ctx, Marker{Epoch: 1}); err != nil || p.TransactionalID != "" {
		t.Fatalf("%+v %v", p, err)
	}
	if err := s.Commit(ctx, 1); err != nil {
		t.Fatal(err)
	}
	writeN(t, ctx, s, 2, 3)
	if _, err := s.PreCommit(ctx, Marker{Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	s.Close() // crash before manifest 2
	d, err := Recover(ctx, RecoverInput{Sink: sc, Job: "j", SinkName: "s", Parallelism: 1, LastCommitted: 1})
	if err != nil || d.RollForward || d.Epoch != 1 {
		t.Fatalf("%+v %v", d, err)
	}
	s2, _ := NewSink(ctx, sc, id, 2)
	defer s2.Close()
	writeN(t, ctx, s2, 2, 3)
	if _, err := s2.PreCommit(ctx, Marker{Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	if got := len(readTopic(t, c, "out", true)); got != 10 {
		t.Fatalf("%d records, want 4 + 3 + 3 duplicated", got)
	}
}

// TestSinkAuthorization: a principal that may write the topics but not use the sink's
// transactional IDs gets ErrAuthorization from NewSink; with a prefixed ACL on "clink.j." the
// same sink commits.
func TestSinkAuthorization(t *testing.T) {
	topicACL := func(name string, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	acls := []kfake.ACL{topicACL("out", kmsg.ACLOperationWrite), topicACL("out", kmsg.ACLOperationDescribe),
		topicACL("markers", kmsg.ACLOperationWrite), topicACL("markers", kmsg.ACLOperationDescribe), topicACL("markers", kmsg.ACLOperationRead)}
	withTxn := append(slices.Clone(acls),
		kfake.ACL{Resource: kmsg.ACLResourceTypeTransactionalId, Name: "clink.j.", Pattern: kmsg.ACLResourcePatternTypePrefixed, Operation: kmsg.ACLOperationWrite, Allow: true},
		kfake.ACL{Resource: kmsg.ACLResourceTypeTransactionalId, Name: "clink.j.", Pattern: kmsg.ACLResourcePatternTypePrefixed, Operation: kmsg.ACLOperationDescribe, Allow: true})
	cl := kfake.MustCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "out", "markers"), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser("PLAIN", "admin", "admin"),
		kfake.User("PLAIN", "bob", "pw", acls...),
		kfake.User("PLAIN", "carol", "pw", withTxn...))
	t.Cleanup(cl.Close)
	cfg := func(user string) SinkConfig {
		return SinkConfig{Topic: "out", MarkerTopic: "markers", Config: Config{Brokers: cl.ListenAddrs(), RequestTimeout: Duration(5 * time.Second),
			SASL: &SASLConfig{Mechanism: "PLAIN", Username: user, PasswordEnv: "PW"},
			env:  func(string) (string, bool) { return "pw", true }}}
	}
	ctx := context.Background()
	id := Identity{Job: "j", Sink: "s"}
	if _, err := NewSink(ctx, cfg("bob"), id, 1); !errors.Is(err, ErrAuthorization) || IsRetryable(err) {
		t.Fatalf("bob: %v, want a permanent ErrAuthorization", err)
	}
	s, err := NewSink(ctx, cfg("carol"), id, 1)
	if err != nil {
		t.Fatalf("carol: %v", err)
	}
	defer s.Close()
	writeN(t, ctx, s, 1, 3)
	if _, err := s.PreCommit(ctx, Marker{Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, 1); err != nil {
		t.Fatal(err)
	}
}
