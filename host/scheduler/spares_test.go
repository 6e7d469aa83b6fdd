package scheduler

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// runnerOnly records what the pipeline sees of instance setup: clink_open's log lines and
// lookups. Its fields are written without a lock, so a call made off the runner (a spare's
// setup on the maker goroutine, not forwarded) is a data race that -race reports.
type runnerOnly struct {
	logs    []string
	lookups []string
}

func (r *runnerOnly) log(_ string, _ abi.LogLevel, msg []byte, src *Source) {
	if src == nil {
		r.logs = append(r.logs, string(msg))
	}
}

func (r *runnerOnly) lookup(_ context.Context, _ uint32, req []byte, done func(int, []byte, error)) {
	r.lookups = append(r.lookups, string(req))
	go done(200, nil, nil)
}

// spareRun runs opensetup (clink_open logs, reads the watermark and looks up; every record
// reads cold state, so each record in flight holds an instance) over 600 records of 300 keys.
func spareRun(t *testing.T, opts ...Option) (*Controller, *collectSink, *runnerOnly) {
	t.Helper()
	m := loadModule(t, "testdata/opensetup.wasm")
	tier := newFakeTier(5, 200*time.Microsecond, time.Millisecond, 0)
	sink := &collectSink{}
	ro := &runnerOnly{}
	var els []Element
	rng := rand.New(rand.NewPCG(3, 3))
	for i := range 600 {
		els = append(els, rec(fmt.Sprintf("k%03d", rng.IntN(300)), uint64(i), int64(i), int64(i+1)))
	}
	c, err := New(m, tier, sink, append([]Option{WithLookup(ro.lookup), WithGuestLog(ro.log), WithExecMode(ExecDirect)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background(), feed(els, 32)); err != nil {
		t.Fatal(err)
	}
	tier.pending.Wait()
	if len(sink.outs) != len(els) {
		t.Fatalf("%d outputs for %d records", len(sink.outs), len(els))
	}
	return c, sink, ro
}

// TestSpareInstances: a cold workload needs many instances; most are made off the runner, and
// what their setup does (log, watermark, lookup) reaches the pipeline from the runner, exactly
// once per instance, with the answers an instance made on the runner gets.
func TestSpareInstances(t *testing.T) {
	c, sink, ro := spareRun(t, WithMaxInFlight(64))
	s := c.Metrics()
	if s.Spares == 0 || s.PeakInstances < 8 {
		t.Fatalf("peak %d instances, %d spares: want many instances, some made off the runner", s.PeakInstances, s.Spares)
	}
	if s.PeakInstances > 64+maxSpares {
		t.Errorf("peak %d instances for an in-flight cap of 64", s.PeakInstances)
	}
	// No instance is closed before the run ends, so each one ran clink_open once.
	if int64(len(ro.logs)) != s.PeakInstances || int64(len(ro.lookups)) != s.PeakInstances {
		t.Errorf("%d open logs and %d open lookups for %d instances", len(ro.logs), len(ro.lookups), s.PeakInstances)
	}
	for i, l := range ro.lookups {
		if l != "open" || ro.logs[i] != "open" {
			t.Fatalf("setup call %d: log %q, lookup %q", i, ro.logs[i], l)
		}
	}
	// The synchronous controller (one instance, made on the runner) is the reference for
	// what clink_open saw.
	_, ref, _ := spareRun(t, WithSynchronous(true))
	want := ref.outs[0].value[:12]
	for _, o := range sink.outs {
		if string(o.value[:12]) != string(want) || binary.LittleEndian.Uint32(o.value) != 200 {
			t.Fatalf("record %s: open saw status/watermark %x, want %x (status 200)", o.key, o.value[:12], want)
		}
	}
}

// TestSpareBudget: spares count against the instance budget while they are being made.
func TestSpareBudget(t *testing.T) {
	probe, _, _ := spareRun(t, WithMaxInFlight(64))
	cost := probe.nextCost
	if cost <= 0 {
		t.Fatalf("instance cost %d", cost)
	}
	budget := 5*cost + cost/2
	c, _, _ := spareRun(t, WithMaxInFlight(64), WithInstanceMemoryBudget(budget))
	s := c.Metrics()
	// Each controller measures an instance's cost itself, from the heap's growth, which varies
	// between runs (more so under -race): what the budget allows is judged by this run's cost.
	allowed := max(budget/c.nextCost, 1)
	if s.PeakInstances > allowed || s.InstanceWaits == 0 {
		t.Errorf("budget of %d B at %d B per instance: peak %d instances, %d waits", budget, c.nextCost, s.PeakInstances, s.InstanceWaits)
	}
	if s.Spares == 0 && allowed >= 3 {
		t.Errorf("no spares within a budget of %d instances", allowed)
	}
	if c.spareOut != 0 || c.spareBytes != 0 || c.instances != 0 {
		t.Errorf("after Run: %d spares out, %d bytes reserved, %d instances", c.spareOut, c.spareBytes, c.instances)
	}
}

// TestSparesCancelled: a run cancelled while spares are being made returns once they have all
// arrived, and leaves no instance behind.
func TestSparesCancelled(t *testing.T) {
	m := loadModule(t, "testdata/opensetup.wasm")
	tier := newFakeTier(5, time.Millisecond, 2*time.Millisecond, 0)
	ro := &runnerOnly{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink := SinkFunc(func(b *Batch) error {
		cancel() // the first output batch: spares are on the way by then
		b.Release()
		return nil
	})
	c, err := New(m, tier, sink, WithLookup(ro.lookup), WithGuestLog(ro.log), WithMaxInFlight(256), WithExecMode(ExecDirect))
	if err != nil {
		t.Fatal(err)
	}
	var els []Element
	for i := range 5000 {
		els = append(els, rec(fmt.Sprintf("k%04d", i), uint64(i), int64(i), int64(i+1)))
	}
	if err := c.Run(ctx, feed(els, 64)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want cancelled", err)
	}
	tier.pending.Wait()
	if c.spareOut != 0 || c.instances != 0 || c.outstanding != 0 {
		t.Errorf("after Run: %d spares out, %d instances, %d outstanding", c.spareOut, c.instances, c.outstanding)
	}
	if c.Metrics().PeakInstances < 2 {
		t.Errorf("peak %d instances: the run never needed a second", c.Metrics().PeakInstances)
	}
}

// TestSparesOff: WithSpareInstances(false) makes instances only on demand, on the runner.
func TestSparesOff(t *testing.T) {
	c, _, ro := spareRun(t, WithMaxInFlight(64), WithSpareInstances(false))
	s := c.Metrics()
	if s.Spares != 0 || s.PeakInstances < 2 || int64(len(ro.logs)) != s.PeakInstances {
		t.Errorf("spares off: %d spares, peak %d instances, %d open logs", s.Spares, s.PeakInstances, len(ro.logs))
	}
}

// TestSpareFails: an instance whose clink_open fails (here every one after the third) fails the
// run with the guest's fault whether a spare or an instance made on the runner meets it first;
// the run returns, and leaves no instance or spare behind.
func TestSpareFails(t *testing.T) {
	m := loadModule(t, "testdata/opensetup.wasm")
	tier := newFakeTier(5, 200*time.Microsecond, time.Millisecond, 0)
	var opens atomic.Int32
	lookup := func(_ context.Context, _ uint32, _ []byte, done func(int, []byte, error)) {
		status := 200
		if opens.Add(1) > 3 {
			status = 500
		}
		go done(status, nil, nil)
	}
	c, err := New(m, tier, &collectSink{}, WithLookup(lookup), WithMaxInFlight(64), WithExecMode(ExecDirect))
	if err != nil {
		t.Fatal(err)
	}
	var els []Element
	for i := range 600 {
		els = append(els, rec(fmt.Sprintf("k%03d", i%300), uint64(i), int64(i), int64(i+1)))
	}
	err = c.Run(context.Background(), feed(els, 32))
	var fault *abi.Fault
	if !errors.As(err, &fault) || fault.Export != abi.ExportOpen {
		t.Fatalf("Run: %v, want clink_open's fault", err)
	}
	tier.pending.Wait()
	if c.spareOut != 0 || c.spareBytes != 0 || c.instances != 0 || c.outstanding != 0 {
		t.Errorf("after Run: %d spares out, %d bytes reserved, %d instances, %d outstanding", c.spareOut, c.spareBytes, c.instances, c.outstanding)
	}
	if n := opens.Load(); n < 4 {
		t.Errorf("%d instances opened: the failing one never ran", n)
	}
}
