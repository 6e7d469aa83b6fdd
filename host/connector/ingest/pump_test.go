package ingest

import (
	"context"
	"path/filepath"
	"testing"
)

// TestLogPump: with a pump set (a pumped reader, pipeline.PumpedReader), every append runs it
// once its batch is durable, in the appender's goroutine. A pump that read everything leaves
// the readers asleep (the notify channel is not closed); one that refused, or read only part,
// wakes them; Next never waits while the pump is set; Close of the reader removes the pump.
func TestLogPump(t *testing.T) {
	l, err := Open(filepath.Join(t.TempDir(), "log"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r, err := l.NewReader(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]Record, 2)
	var calls int
	var got []string
	var durableSeen int64
	take := true // the pump's answer
	r.setPump(func() bool {
		calls++
		durableSeen = l.Durable() // the batch is durable before the pump runs
		if !take {
			return false
		}
		n, err := r.Next(context.Background(), recs)
		if err != nil {
			t.Error(err)
		}
		for _, rec := range recs[:n] {
			got = append(got, string(rec.Value))
		}
		return true
	})
	notify := func() <-chan struct{} {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.notify
	}
	before := notify()
	res, err := l.Append("", []byte(`{"a":1}`+"\n"+`{"a":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if calls != 1 || durableSeen != res.End || len(got) != 2 || got[1] != `{"a":2}` {
		t.Fatalf("pump: %d calls, saw durable %d (want %d), read %q", calls, durableSeen, res.End, got)
	}
	if notify() != before {
		t.Fatal("a pump that read the whole batch woke the readers")
	}
	// Three records, of which the pump reads two: the reader is behind, so the readers wake.
	if _, err := l.Append("", []byte(`{"b":1}`+"\n"+`{"b":2}`+"\n"+`{"b":3}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-before:
	default:
		t.Fatal("a pump that left records unread did not wake the readers")
	}
	// The goroutine's turn: wait returns at once (records are there), Next reads the last one.
	r.waitRecords(context.Background(), nil)
	if n, err := r.Next(context.Background(), recs); err != nil || n != 1 || string(recs[0].Value) != `{"b":3}` {
		t.Fatalf("the rest: %d records (%v)", n, err)
	}
	// Nothing left: Next does not wait while a pump is set.
	if n, err := r.Next(context.Background(), recs); n != 0 || err != nil {
		t.Fatalf("an empty read: %d, %v", n, err)
	}
	// A pump that refuses: the readers wake, and a duplicate (by key) runs no pump.
	take = false
	before = notify()
	if _, err := l.Append("k1", []byte(`{"c":1}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-before:
	default:
		t.Fatal("a pump that refused did not wake the readers")
	}
	if res, err := l.Append("k1", []byte(`{"c":1}`)); err != nil || !res.Duplicate || calls != 3 {
		t.Fatalf("a duplicate: %+v, %v, %d pump calls (want 3)", res, err, calls)
	}
	r.Close()
	if _, err := l.Append("", []byte(`{"d":1}`)); err != nil || calls != 3 {
		t.Fatalf("after the reader's Close: %v, %d pump calls (want 3)", err, calls)
	}
}
