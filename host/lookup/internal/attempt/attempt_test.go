package attempt

import (
	"testing"
	"time"
)

type fakeConn struct{ deadline time.Time }

func (c *fakeConn) SetDeadline(t time.Time) error { c.deadline = t; return nil }

type fakeCanceler struct{ n int }

func (c *fakeCanceler) CancelAttempt() { c.n++ }

func TestOwnershipAndCancel(t *testing.T) {
	var a Attempt
	a.Reset(time.Time{})
	c := &fakeConn{}
	if !a.Own(c) {
		t.Fatal("Own refused on a fresh attempt")
	}
	if a.Disown() {
		t.Fatal("Disown reports a cancel that did not happen")
	}
	a.Cancel() // after Disown: the connection (back in a pool) must not be touched
	if !c.deadline.IsZero() {
		t.Fatalf("Cancel after Disown set the deadline to %v", c.deadline)
	}
	if a.Own(c) || !a.Cancelled() {
		t.Fatal("Own accepted a cancelled attempt")
	}
	if _, ok := a.Dialling(func() {}); ok {
		t.Fatal("Dialling accepted a cancelled attempt")
	}

	a.Reset(time.Time{})
	if !a.Own(c) {
		t.Fatal("Own refused after Reset")
	}
	a.Cancel()
	if !c.deadline.Before(time.Unix(2, 0)) || !a.Disown() {
		t.Fatalf("Cancel while owned: deadline %v, want one in the past, and Disown to report it", c.deadline)
	}

	a.Reset(time.Time{})
	fc := &fakeCanceler{}
	dialCancelled := 0
	done, ok := a.Dialling(func() { dialCancelled++ })
	if !ok || !a.Bind(fc) {
		t.Fatal("Dialling or Bind refused")
	}
	a.Cancel()
	a.Cancel()
	done()
	if fc.n != 1 || dialCancelled < 1 { // a CancelFunc may be called again
		t.Fatalf("canceler called %d times, dial cancel %d: want once, at least once", fc.n, dialCancelled)
	}
	if a.Bind(fc) {
		t.Fatal("Bind accepted a cancelled attempt")
	}
}

func TestUpstream(t *testing.T) {
	var a Attempt
	a.Reset(time.Time{})
	if _, ok := a.Upstream(); ok {
		t.Fatal("Upstream without marks")
	}
	t0 := time.Now()
	a.MarkSent(t0)
	if _, ok := a.Upstream(); ok {
		t.Fatal("Upstream without an answer")
	}
	a.MarkAnswered(t0.Add(3 * time.Millisecond))
	if d, ok := a.Upstream(); !ok || d != 3*time.Millisecond {
		t.Fatalf("Upstream = %v %v, want 3ms", d, ok)
	}
	a.Reset(time.Time{})
	if _, ok := a.Upstream(); ok || a.Wrote() {
		t.Fatal("Reset kept the marks")
	}
}
