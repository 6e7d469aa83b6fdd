package abi

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/tetratelabs/wazero/api"
)

// fakeModule is an api.Module whose Close is observed (and, with gate, held until gate closes).
// Nothing else is called on it.
type fakeModule struct {
	api.Module
	gate   chan struct{}
	closes atomic.Int32
}

func (m *fakeModule) Close(context.Context) error {
	if m.gate != nil {
		<-m.gate
	}
	m.closes.Add(1)
	return nil
}

// TestReleaserBounded: modules are closed off the caller's path while their memory fits
// maxPendingRelease, and by the caller once it would not; every module is closed exactly once,
// and close waits for the queue.
func TestReleaserBounded(t *testing.T) {
	r := newReleaser()
	held := &fakeModule{gate: make(chan struct{})}
	r.release(held, 1<<20) // the drain goroutine blocks in its Close
	const each = 8 << 20
	var queued []*fakeModule
	for r.pending+each <= maxPendingRelease {
		m := &fakeModule{}
		r.release(m, each)
		if m.closes.Load() != 0 {
			t.Fatalf("module %d closed inline with %d bytes pending", len(queued), r.pending)
		}
		queued = append(queued, m)
	}
	over := &fakeModule{}
	r.release(over, each)
	if over.closes.Load() != 1 {
		t.Fatalf("module past the bound not closed by the caller (%d bytes pending)", r.pending)
	}
	close(held.gate)
	r.close()
	for i, m := range append(queued, held) {
		if n := m.closes.Load(); n != 1 {
			t.Errorf("module %d closed %d times", i, n)
		}
	}
	if r.pending != 0 || r.running {
		t.Errorf("after close: pending %d, running %v", r.pending, r.running)
	}
	after := &fakeModule{}
	r.release(after, 1)
	if after.closes.Load() != 1 {
		t.Error("a release after close was not closed inline")
	}
}

// TestInstanceCloseReleasesModule: a closed instance's module is closed once the releaser has
// drained, and Engine.Close leaves none open.
func TestInstanceCloseReleasesModule(t *testing.T) {
	e := newEngine(t, Limits{})
	m := load(t, e, "counter")
	ctx := context.Background()
	var mods []api.Module
	for range 4 {
		in, err := m.Instantiate(ctx, newRec())
		if err != nil {
			t.Fatal(err)
		}
		if err := in.Process([]byte("k"), []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
		mods = append(mods, in.mod)
		if err := in.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	e.rel.wait()
	for i, mod := range mods {
		if !mod.IsClosed() {
			t.Errorf("module of closed instance %d still open", i)
		}
	}
	in, err := m.Instantiate(ctx, newRec())
	if err != nil {
		t.Fatal(err)
	}
	in.Close(ctx)
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !in.mod.IsClosed() {
		t.Error("module still open after Engine.Close")
	}
}
