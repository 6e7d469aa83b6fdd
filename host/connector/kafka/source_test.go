package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// produce writes n JSON records {"k":..,"i":..,"ts":..} to topic, spread over its partitions
// by key, and returns them by split in offset order.
func produce(t testing.TB, c Config, topic string, n int) map[Split][]int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for i := range n {
		k := fmt.Sprintf("k%d", i%7)
		v := fmt.Sprintf(`{"k":%q,"i":%d,"ts":%d}`, k, i, 1000+i)
		recs = append(recs, &kgo.Record{Key: []byte(k), Value: []byte(v), Timestamp: time.UnixMilli(int64(5000 + i))})
	}
	res := cl.ProduceSync(context.Background(), recs...)
	if err := res.FirstErr(); err != nil {
		t.Fatal(err)
	}
	out := map[Split][]int{}
	for i, r := range res {
		sp := Split{r.Record.Topic, r.Record.Partition}
		out[sp] = append(out[sp], i)
	}
	return out
}

func drain(t testing.TB, s *Source, want int) []Record {
	t.Helper()
	var got []Record
	for tries := 0; len(got) < want && tries < 200; tries++ {
		recs, err := s.Poll(context.Background(), 100*time.Millisecond, min(50, want-len(got)))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, recs...)
	}
	if len(got) != want {
		t.Fatalf("read %d records, want %d", len(got), want)
	}
	return got
}

func index(t testing.TB, r Record) int {
	var v struct{ I int }
	if err := json.Unmarshal(r.Value, &v); err != nil {
		t.Fatal(err)
	}
	return v.I
}

// TestSourceResume: read part of a topic, take Positions (a checkpoint), then a new source
// opened at those positions reads exactly the rest: no record twice, none missing, and per
// partition in offset order. The group's committed offsets (deliberately set elsewhere) are
// ignored when positions are given.
func TestSourceResume(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(3, "in"))
	produce(t, c, "in", 300)
	sc := SourceConfig{Config: c, Topics: []string{"in"}, KeyField: "k", TimeField: "ts", Group: "g", StartFrom: "committed"}

	// A group offset far ahead, which a restore must not use.
	adm, _ := kgo.NewClient(kgo.SeedBrokers(c.Brokers...))
	defer adm.Close()
	var off kadm.Offsets
	off.AddOffset("in", 0, 90, -1)
	if _, err := kadm.NewClient(adm).CommitOffsets(context.Background(), "g", off); err != nil {
		t.Fatal(err)
	}

	s1, err := NewSource(sc)
	if err != nil {
		t.Fatal(err)
	}
	splits, err := s1.Splits(context.Background())
	if err != nil || len(splits) != 3 {
		t.Fatalf("splits %v, %v", splits, err)
	}
	if err := s1.Open(context.Background(), splits, Positions{{"in", 0}: 0, {"in", 1}: 0, {"in", 2}: 0}); err != nil {
		t.Fatal(err)
	}
	first := drain(t, s1, 120)
	ckpt := s1.Positions()
	s1.Close()
	sum := int64(0)
	for _, v := range ckpt {
		sum += v
	}
	if sum != 120 {
		t.Fatalf("positions %v sum to %d, want 120", ckpt, sum)
	}
	b, _ := json.Marshal(ckpt)
	var restored Positions
	if err := json.Unmarshal(b, &restored); err != nil || !maps.Equal(restored, ckpt) {
		t.Fatalf("positions round trip %s: %v %v", b, restored, err)
	}

	s2, _ := NewSource(sc)
	defer s2.Close()
	if err := s2.Open(context.Background(), splits, restored); err != nil {
		t.Fatal(err)
	}
	rest := drain(t, s2, 180)
	seen := map[int]bool{}
	last := map[Split]int64{}
	for _, r := range append(first, rest...) {
		i := index(t, r)
		if seen[i] {
			t.Fatalf("record %d read twice", i)
		}
		seen[i] = true
		if o, ok := last[r.Split]; ok && r.Offset <= o {
			t.Fatalf("%v: offset %d after %d", r.Split, r.Offset, o)
		}
		last[r.Split] = r.Offset
		if r.Err != nil || string(r.Key) != fmt.Sprintf("k%d", i%7) || r.Time != int64(1000+i) {
			t.Fatalf("record %d: key %q time %d err %v", i, r.Key, r.Time, r.Err)
		}
	}
	if len(seen) != 300 {
		t.Fatalf("read %d distinct records", len(seen))
	}
}

// TestSourceStartFrom: without positions, "committed" starts at the group's offset where it
// has one and at the earliest elsewhere; "latest" reads only what comes after Open.
func TestSourceStartFrom(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(2, "in"))
	byPart := produce(t, c, "in", 40)
	adm, _ := kgo.NewClient(kgo.SeedBrokers(c.Brokers...))
	defer adm.Close()
	var off kadm.Offsets
	off.AddOffset("in", 0, 5, -1)
	if _, err := kadm.NewClient(adm).CommitOffsets(context.Background(), "g", off); err != nil {
		t.Fatal(err)
	}
	s, err := NewSource(SourceConfig{Config: c, Topics: []string{"in"}, Group: "g", StartFrom: "committed"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	splits, _ := s.Splits(context.Background())
	if err := s.Open(context.Background(), splits, nil); err != nil {
		t.Fatal(err)
	}
	want := Positions{{"in", 0}: 5, {"in", 1}: 0}
	if got := s.Positions(); !maps.Equal(got, want) {
		t.Fatalf("start positions %v, want %v", got, want)
	}
	drain(t, s, 40-5)

	l, _ := NewSource(SourceConfig{Config: c, Topics: []string{"in"}, StartFrom: "latest", Value: "raw"})
	defer l.Close()
	if err := l.Open(context.Background(), splits, nil); err != nil {
		t.Fatal(err)
	}
	want = Positions{{"in", 0}: int64(len(byPart[Split{"in", 0}])), {"in", 1}: int64(len(byPart[Split{"in", 1}]))}
	if got := l.Positions(); !maps.Equal(got, want) {
		t.Fatalf("latest positions %v, want %v", got, want)
	}
	produce(t, c, "in", 10)
	for _, r := range drain(t, l, 10) {
		if index(t, r) >= 10 {
			t.Fatalf("latest read an old record %s", r.Value)
		}
	}
}

// TestSourcePatternAndBadRecords: a pattern picks the matching topics only; a value that is
// not JSON, or lacks the key field, comes back with Err set and its position consumed.
func TestSourcePatternAndBadRecords(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "ev.a", "ev.b", "other"))
	cl, _ := kgo.NewClient(kgo.SeedBrokers(c.Brokers...))
	defer cl.Close()
	ctx := context.Background()
	for _, r := range []*kgo.Record{
		{Topic: "ev.a", Value: []byte(`{"k":"x"}`)},
		{Topic: "ev.a", Value: []byte(`not json`)},
		{Topic: "ev.b", Value: []byte(`{"j":1}`)},
		{Topic: "other", Value: []byte(`{"k":"o"}`)},
	} {
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	s, err := NewSource(SourceConfig{Config: c, Pattern: `^ev\.`, KeyField: "k"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	splits, err := s.Splits(ctx)
	if err != nil || len(splits) != 2 || splits[0].Topic != "ev.a" || splits[1].Topic != "ev.b" {
		t.Fatalf("splits %v %v", splits, err)
	}
	if err := s.Open(ctx, splits, nil); err != nil {
		t.Fatal(err)
	}
	recs := drain(t, s, 3)
	bad := 0
	for _, r := range recs {
		switch string(r.Value) {
		case `{"k":"x"}`:
			if r.Err != nil || string(r.Key) != "x" {
				t.Errorf("good record: key %q err %v", r.Key, r.Err)
			}
		case `not json`:
			bad++
			if r.Err == nil || !strings.Contains(r.Err.Error(), "not JSON") {
				t.Errorf("bad JSON: %v", r.Err)
			}
		case `{"j":1}`:
			bad++
			if r.Err == nil || !strings.Contains(r.Err.Error(), `no key field "k"`) {
				t.Errorf("missing key: %v", r.Err)
			}
		}
	}
	if bad != 2 {
		t.Fatalf("%d bad records flagged", bad)
	}
	if got := s.Positions(); !maps.Equal(got, Positions{{"ev.a", 0}: 2, {"ev.b", 0}: 1}) {
		t.Fatalf("positions %v", got)
	}
	nm, _ := NewSource(SourceConfig{Config: c, Pattern: `^nomatch$`})
	defer nm.Close()
	if _, err := nm.Splits(ctx); err == nil || !strings.Contains(err.Error(), "no topic matches") {
		t.Fatalf("no match: %v", err)
	}
}

func TestAssign(t *testing.T) {
	var all []Split
	for p := range int32(5) {
		all = append(all, Split{"b", p}, Split{"a", p})
	}
	seen := map[Split]int{}
	for i := range 3 {
		for _, s := range Assign(all, i, 3) {
			seen[s]++
		}
	}
	if len(seen) != 10 {
		t.Fatalf("assigned %d of 10", len(seen))
	}
	for s, n := range seen {
		if n != 1 {
			t.Fatalf("%v assigned %d times", s, n)
		}
	}
}

// TestSourceAddRemoveSplits: a subtask that starts with no split gets one, then a second;
// the first is revoked and handed over with its position to another source, which reads
// exactly the rest of it. Nothing is read twice or lost.
func TestSourceAddRemoveSplits(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(2, "in"))
	byPart := produce(t, c, "in", 100)
	ctx := context.Background()
	p0, p1 := Split{"in", 0}, Split{"in", 1}
	a, _ := NewSource(SourceConfig{Config: c, Topics: []string{"in"}})
	defer a.Close()
	if err := a.Open(ctx, nil, nil); err != nil {
		t.Fatal(err)
	}
	if recs, err := a.Poll(ctx, 10*time.Millisecond, 10); err != nil || len(recs) != 0 {
		t.Fatalf("no split: %v %v", recs, err)
	}
	if err := a.AddSplits(ctx, []Split{p0}, nil); err != nil {
		t.Fatal(err)
	}
	n0 := len(byPart[p0])
	got := map[int]bool{}
	for _, r := range drain(t, a, n0/2) {
		got[index(t, r)] = true
	}
	if err := a.AddSplits(ctx, []Split{p1}, Positions{p1: 0}); err != nil {
		t.Fatal(err)
	}
	if err := a.AddSplits(ctx, []Split{p1}, nil); err == nil {
		t.Fatal("a split added twice")
	}
	handed := a.RemoveSplits([]Split{p0})
	if handed[p0] != int64(n0/2) {
		t.Fatalf("handed over %v, want %d", handed, n0/2)
	}
	for _, r := range drain(t, a, len(byPart[p1])) {
		if r.Split != p1 {
			t.Fatalf("a record of the revoked split: %v@%d", r.Split, r.Offset)
		}
		got[index(t, r)] = true
	}
	b, _ := NewSource(SourceConfig{Config: c, Topics: []string{"in"}})
	defer b.Close()
	if err := b.Open(ctx, []Split{p0}, handed); err != nil {
		t.Fatal(err)
	}
	for _, r := range drain(t, b, n0-n0/2) {
		if got[index(t, r)] {
			t.Fatalf("record %d read twice", index(t, r))
		}
		got[index(t, r)] = true
	}
	if len(got) != 100 {
		t.Fatalf("%d distinct records", len(got))
	}
}

// TestSourcePositionLost: a restored position beyond the partition's end (the topic was
// recreated) is ErrPositionLost, not a silent reset.
func TestSourcePositionLost(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "in"))
	produce(t, c, "in", 5)
	s, _ := NewSource(SourceConfig{Config: c, Topics: []string{"in"}})
	defer s.Close()
	err := s.Open(context.Background(), []Split{{"in", 0}}, Positions{{"in", 0}: 50})
	if !errors.Is(err, ErrPositionLost) || IsRetryable(err) {
		t.Fatalf("got %v, want a permanent ErrPositionLost", err)
	}
	ok, _ := NewSource(SourceConfig{Config: c, Topics: []string{"in"}})
	defer ok.Close()
	if err := ok.Open(context.Background(), []Split{{"in", 0}}, Positions{{"in", 0}: 5}); err != nil {
		t.Fatalf("position at the end: %v", err)
	}
}
