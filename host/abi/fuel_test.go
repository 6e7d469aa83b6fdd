package abi

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// BenchmarkFuelRefill measures how often a running call reaches the host's fuel check (ms/check:
// the call's time over the checks it made, whether its refill ran out or the watchdog forced
// them) and how late after its time limit a runaway call is stopped (ms-late), for each shape of
// spin.wasm. See fuel.go for the figures without the watchdog.
func BenchmarkFuelRefill(b *testing.B) {
	for _, shape := range []struct {
		name string
		key  string // its length selects the shape in spin.wat
	}{
		{"empty-loop", "1"},
		{"heavy-loop", "22"},
		{"memory-fill-loop", "333"},
		{"recursion", "4444"},
	} {
		b.Run(shape.name, func(b *testing.B) {
			const limit = 200 * time.Millisecond
			e := newEngine(b, Limits{CallTime: limit})
			m := load(b, e, "spin")
			var refills uint64
			var elapsed time.Duration
			for b.Loop() {
				in, err := m.Instantiate(context.Background(), newRec())
				if err != nil {
					b.Fatal(err)
				}
				before := in.refills
				start := time.Now()
				err = in.Process([]byte(shape.key), nil, 0)
				elapsed += time.Since(start)
				refills += in.refills - before
				var f *Fault
				if !errors.As(err, &f) || f.Kind != FaultTimeLimit {
					b.Fatalf("want a time-limit fault, got %v", err)
				}
				in.Close(context.Background())
			}
			b.ReportMetric(float64(elapsed.Microseconds())/1000/float64(refills), "ms/check")
			b.ReportMetric(float64(elapsed-time.Duration(b.N)*limit)/float64(b.N)/1e6, "ms-late")
		})
	}
}

// spinIterations is the iteration count spin.wat's shapes 2 and 3 keep at address 0.
func spinIterations(t *testing.T, in *Instance) uint32 {
	n, ok := in.mem.ReadUint32Le(0)
	if !ok {
		t.Fatal("spin's counter is outside memory")
	}
	return n
}

// TestWatchdogStopsLongIterations: a loop whose iterations are long (a big body, a bulk memory
// instruction) is stopped at its time limit, not after a whole refill of iterations, which took
// 0.8 s and 23 s for these two before the watchdog.
func TestWatchdogStopsLongIterations(t *testing.T) {
	for _, key := range []string{"22", "333"} {
		e := newEngine(t, Limits{CallTime: 5 * time.Millisecond})
		m := load(t, e, "spin")
		in, err := m.Instantiate(context.Background(), newRec())
		if err != nil {
			t.Fatal(err)
		}
		err = in.Process([]byte(key), nil, 0)
		var f *Fault
		if !errors.As(err, &f) || f.Kind != FaultTimeLimit {
			t.Fatalf("shape %d: want a time-limit fault, got %v", len(key), err)
		}
		// Without the watchdog the first fuel check comes only once a whole refill of
		// iterations has run, so fewer than a refill means the watchdog stopped it. (How many
		// fewer depends on the machine's speed, which a test must not assume.)
		if n := spinIterations(t, in); n == 0 || n >= fuelRefill {
			t.Errorf("shape %d ran %d iterations before it was stopped, want some but fewer than a refill (%d)", len(key), n, fuelRefill)
		}
		in.Close(context.Background())
	}
}

// TestCancellationStopsLongIterations: cancelling an instance's context stops a running call
// that would not reach a fuel check on its own for a long time.
func TestCancellationStopsLongIterations(t *testing.T) {
	e := newEngine(t, Limits{CallTime: time.Hour})
	m := load(t, e, "spin")
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	in, err := m.Instantiate(ctx, newRec())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Process([]byte("333"), nil, 0) }()
	// Cancel once the loop runs, so the call has passed its first fuel check.
	for spinIterations(t, in) == 0 {
		select {
		case err := <-done:
			t.Fatalf("the call returned before it was cancelled: %v", err)
		default:
			runtime.Gosched()
		}
	}
	cancel(errors.New("operator stopped"))
	err = <-done
	var f *Fault
	if !errors.As(err, &f) || f.Kind != FaultCancelled || !strings.Contains(err.Error(), "operator stopped") {
		t.Fatalf("want a cancellation fault with its cause, got %v", err)
	}
	if n := spinIterations(t, in); n >= fuelRefill/4 {
		t.Errorf("the loop ran %d iterations, want far fewer than a refill (%d)", n, fuelRefill)
	}
}

// TestWatchdogGoroutineBelongsToEngine: the watchdog's goroutine starts and ends with its
// engine, so an engine used inside a testing/synctest bubble leaves nothing running there, and
// instances made inside a bubble from an engine outside it start nothing there either.
func TestWatchdogGoroutineBelongsToEngine(t *testing.T) {
	outside := newEngine(t, Limits{})
	m := load(t, outside, "counter")
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		in, err := m.Instantiate(ctx, newRec())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // fake time: would tick a watchdog started in here
		in.Close(ctx)

		e, err := NewEngine(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := load(t, e, "counter")
		in, err = m.Instantiate(ctx, newRec())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		in.Close(ctx)
		if err := e.Close(ctx); err != nil {
			t.Fatal(err)
		}
		// Returning with the watchdog still running would make synctest.Test panic.
	})
}
