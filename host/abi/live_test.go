package abi

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestLiveMemoryLimit: a memory limit lowered on the engine (a live quota) stops the growth of
// an instance created before the change, at the new limit, as an out-of-memory fault.
func TestLiveMemoryLimit(t *testing.T) {
	e := newEngine(t, Limits{MemoryPages: 1024})
	m := load(t, e, "memfill")
	in, err := m.Instantiate(context.Background(), newRec())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close(context.Background())
	e.SetLiveLimits(0, 64) // 4 MiB
	err = in.Process([]byte("k"), nil, 0)
	var f *Fault
	if !errors.As(err, &f) || f.Kind != FaultOutOfMemory {
		t.Fatalf("want an out-of-memory fault, got %v", err)
	}
	if got := in.MemoryBytes(); got > 64<<16 || got < 48<<16 {
		t.Fatalf("memfill grew to %d bytes under a live limit of %d", got, 64<<16)
	}
	if f.MemoryLimit != 64<<16 {
		t.Errorf("the fault reports a limit of %d, want the live %d", f.MemoryLimit, 64<<16)
	}
	// Raising past the reservation is capped at it.
	e.SetLiveLimits(0, 1<<16)
	if got := e.memoryPages(); got != 1024 {
		t.Errorf("memory limit %d pages after raising past the reservation, want 1024", got)
	}
}

// TestLiveCallTime: a call time limit lowered on the engine reaches an instance already
// created: a runaway call fails naming the new limit (not the engine's 1 h).
func TestLiveCallTime(t *testing.T) {
	e := newEngine(t, Limits{CallTime: time.Hour})
	m := load(t, e, "loop")
	in, err := m.Instantiate(context.Background(), newRec())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close(context.Background())
	e.SetLiveLimits(50*time.Millisecond, 0)
	err = in.Process([]byte("k"), nil, 0)
	var f *Fault
	if !errors.As(err, &f) || f.Kind != FaultTimeLimit || !strings.Contains(err.Error(), "50ms") {
		t.Fatalf("want a time-limit fault naming 50ms, got %v", err)
	}
}
