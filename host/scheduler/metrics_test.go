package scheduler

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// TestSuspensionMetrics checks the suspension path's counters, which the runner keeps privately
// and publishes in bulk (hotCounts): while every admitted record is suspended the runner waits,
// and what it counted so far is in Metrics; at the end every suspension was resumed, and every
// call ran in a coroutine.
func TestSuspensionMetrics(t *testing.T) {
	m := loadModule(t, "testdata/accum.wasm")
	for _, mode := range []ExecMode{ExecCoroutine, ExecDirect} {
		t.Run(fmt.Sprint("mode", mode), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// Every key is read once and is cold: each record suspends once.
				tier := newFakeTier(1, 10*time.Millisecond, 10*time.Millisecond, 0)
				const n = 8
				c, err := New(m, tier, &collectSink{}, WithMaxInFlight(n), WithExecMode(mode))
				if err != nil {
					t.Fatal(err)
				}
				in := make(chan []Element)
				done := make(chan error)
				go func() { done <- c.Run(context.Background(), in) }()
				for i := range n {
					in <- []Element{rec(fmt.Sprint("key", i), 0, 1, int64(i))}
				}
				synctest.Wait() // every record is suspended on its read; the runner waits
				if s := c.Metrics(); s.Suspensions != n || s.Suspended != n || s.StateMisses != n || s.Resumes != 0 {
					t.Errorf("all suspended: %d suspensions, %d suspended, %d misses, %d resumes; want %d, %d, %d, 0",
						s.Suspensions, s.Suspended, s.StateMisses, s.Resumes, n, n, n)
				}
				close(in)
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				tier.pending.Wait()
				s := c.Metrics()
				if s.Suspensions != n || s.Resumes != n || s.Records != n || s.StateMisses != int64(tier.misses) {
					t.Errorf("at the end: %d suspensions, %d resumes, %d records, %d misses (the tier saw %d); want %d of each",
						s.Suspensions, s.Resumes, s.Records, s.StateMisses, tier.misses, n)
				}
				wantCoro := int64(0)
				if mode == ExecCoroutine {
					wantCoro = n
				}
				if s.CoroutineCalls != wantCoro {
					t.Errorf("%d coroutine calls, want %d", s.CoroutineCalls, wantCoro)
				}
			})
		})
	}
}
