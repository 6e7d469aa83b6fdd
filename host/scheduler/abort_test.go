package scheduler

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// TestFailureWithLookupsInFlight: one record traps while hundreds of others wait on a real
// loopback upstream through a real lookup.Endpoint. The run must fail naming that record,
// cancel the context its lookups were sent with, and return only once every lookup has
// delivered, so that no callback writes into a task after Run (or into a recycled task before
// it). Under -race this is the regression test of issue 9's data race: before the fix the
// aborted tasks were reset and pooled while their lookups were still out, and the late
// callbacks wrote t.lookup.
func TestFailureWithLookupsInFlight(t *testing.T) {
	const waiting = 300
	arrived := make(chan struct{}, waiting)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		// Hold every request until the client gives up on it. The timer only bounds a
		// broken run (one that never cancels); no assertion depends on it.
		select {
		case <-r.Context().Done():
		case <-time.After(3 * time.Second):
			fmt.Fprint(w, "late")
		}
	}))
	defer srv.Close()

	reg := lookup.NewRegistry()
	ep, err := reg.Open("t", lookup.EndpointConfig{
		Name: "svc", BaseURL: srv.URL, MaxInFlight: 2 * waiting,
		Egress:      lookup.EgressPolicy{AllowLoopback: true},
		Retry:       lookup.RetryPolicy{MaxAttempts: 1},
		Breaker:     lookup.BreakerConfig{Disabled: true},
		Concurrency: lookup.ConcurrencyConfig{Algorithm: "fixed"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()

	var (
		sent, delivered atomic.Int64
		ctxMu           sync.Mutex
		ctxs            []context.Context
		all             sync.WaitGroup
	)
	lookupFn := func(ctx context.Context, _ uint32, raw []byte, done func(int, []byte, error)) {
		sent.Add(1)
		all.Add(1)
		ctxMu.Lock()
		ctxs = append(ctxs, ctx)
		ctxMu.Unlock()
		req, err := lookup.ParseRequest(raw)
		if err != nil {
			delivered.Add(1)
			all.Done()
			done(0, nil, abi.LookupRefused)
			return
		}
		ep.Do(ctx, req, func(r lookup.Response) {
			defer all.Done()
			defer delivered.Add(1)
			if r.Err != nil {
				done(0, nil, abi.Code(lookup.Kind(r.Err).ABICode()))
				return
			}
			done(r.Status, r.Body, nil)
		})
	}

	// The trapping record is fed only once every other lookup has reached the upstream: they
	// are all suspended, waiting on HTTP, when it fails.
	input := make(chan []Element, 2)
	var els []Element
	for i := range waiting {
		els = append(els, Element{Kind: ElementRecord, Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "GET /k%d", i), Pos: int64(i + 1)})
	}
	go func() {
		input <- els
		for range waiting {
			<-arrived
		}
		input <- []Element{{Kind: ElementRecord, Key: []byte("bad"), Value: []byte("!trap"), Pos: waiting + 1}}
		close(input)
	}()

	m := loadModule(t, "testdata/enrichtrap.wasm")
	c, err := New(m, state.NewMemory(), &collectSink{}, WithLookup(lookupFn), WithMaxInFlight(2*waiting))
	if err != nil {
		t.Fatal(err)
	}
	runErr := c.Run(context.Background(), input)
	// Read at Run's return, before waiting for anything.
	s, d := sent.Load(), delivered.Load()
	ctxMu.Lock()
	live := 0
	for _, ctx := range ctxs {
		if ctx.Err() == nil {
			live++
		}
	}
	ctxMu.Unlock()
	all.Wait() // let a broken run's stragglers finish, so -race sees their writes

	var oe *OperatorError
	if !errors.As(runErr, &oe) || oe.Where != fmt.Sprintf("record #%d", waiting+1) || string(oe.Key) != "bad" {
		t.Fatalf("Run returned %v, want the trap of record #%d (key bad)", runErr, waiting+1)
	}
	var f *abi.Fault
	if !errors.As(runErr, &f) {
		t.Errorf("error %v carries no guest fault", runErr)
	}
	if s < waiting {
		t.Fatalf("only %d lookups were sent, want at least %d in flight", s, waiting)
	}
	if d != s {
		t.Errorf("Run returned with %d of %d lookups still to deliver", s-d, s)
	}
	if live > 0 {
		t.Errorf("%d lookups still had a live context after the run failed", live)
	}
}
