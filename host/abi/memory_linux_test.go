package abi

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"unsafe"
)

// TestLinearMemoryOffHeap is the regression test for the RSS a runaway guest cost (issue 9):
// growing linear memory must not go through the Go heap, where every growth copied the buffer
// and left the old one for the collector. memfill grows to its 64 MiB limit and touches every
// page; the Go heap may not grow by more than a fraction of that.
func TestLinearMemoryOffHeap(t *testing.T) {
	const pages = 1024 // 64 MiB
	e := newEngine(t, Limits{MemoryPages: pages})
	m := load(t, e, "memfill")
	in, err := m.Instantiate(context.Background(), newRec())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close(context.Background())
	if in.MemoryOnHeap() {
		t.Fatal("MemoryOnHeap: the memory is mapped, not on the Go heap")
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err = in.Process([]byte("k"), nil, 0)
	runtime.ReadMemStats(&after)
	var f *Fault
	if !errors.As(err, &f) || f.Kind != FaultOutOfMemory {
		t.Fatalf("want an out-of-memory fault, got %v", err)
	}
	if got, min := in.MemoryBytes(), uint64(pages-16)<<16; got < min {
		t.Fatalf("memfill grew to %d bytes, want at least %d: the test did not exercise growth", got, min)
	}
	// TotalAlloc counts every byte the heap handed out, garbage included.
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 4<<20 {
		t.Errorf("growing linear memory to 64 MiB allocated %d MiB on the Go heap", grew>>20)
	}
}

// TestLinearMemoryDoesNotMove checks the property the allocator exists for: growth happens in
// place, up to the limit, and stops there.
func TestLinearMemoryDoesNotMove(t *testing.T) {
	e := newEngine(t, Limits{MemoryPages: 256})
	m := load(t, e, "counter")
	in, err := m.Instantiate(context.Background(), newRec())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close(context.Background())
	base := func() unsafe.Pointer {
		b, ok := in.mem.Read(0, 1)
		if !ok {
			t.Fatal("memory has no first byte")
		}
		return unsafe.Pointer(&b[0])
	}
	p0 := base()
	pages := in.mem.Size() >> 16
	if _, ok := in.mem.Grow(256 - pages); !ok {
		t.Fatalf("growing from %d to 256 pages was refused", pages)
	}
	if !in.mem.WriteUint32Le(256<<16-4, 7) {
		t.Fatal("the last word of grown memory is not writable")
	}
	if base() != p0 {
		t.Error("linear memory moved when it grew")
	}
	if _, ok := in.mem.Grow(1); ok {
		t.Error("memory grew past its limit")
	}
}

func TestMmapMemoryBounds(t *testing.T) {
	lm := newLinearMemory(0, 4<<16)
	if _, ok := lm.(*mmapMemory); !ok {
		t.Fatalf("got %T, want *mmapMemory", lm)
	}
	if b := lm.Reallocate(2 << 16); len(b) != 2<<16 || cap(b) != 2<<16 {
		t.Fatalf("Reallocate(2 pages) = len %d cap %d", len(b), cap(b))
	}
	if b := lm.Reallocate(5 << 16); b != nil {
		t.Fatal("Reallocate past the reservation succeeded")
	}
	if b := lm.Reallocate(1 << 16); len(b) != 1<<16 {
		t.Fatalf("shrinking Reallocate gave len %d", len(b))
	}
	lm.Free()
	lm.Free() // idempotent
	if b := lm.Reallocate(1 << 16); b != nil {
		t.Fatal("Reallocate after Free succeeded")
	}
	if b := newLinearMemory(0, 0).Reallocate(0); len(b) != 0 {
		t.Fatal("a zero-page memory has bytes")
	}
}
