package abi

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func le64(v uint64) string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	return string(b[:])
}

func newFast(t *testing.T, lim Limits) (*Instance, *recHandler) {
	t.Helper()
	e := newEngine(t, lim)
	m := load(t, e, "fast")
	if fmt.Sprint(m.Manifest.PrefetchIDs()) != "[0 1]" {
		t.Fatalf("prefetch ids %v", m.Manifest.PrefetchIDs())
	}
	h := newRec()
	in, err := m.Instantiate(context.Background(), h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(context.Background()) })
	return in, h
}

// TestPrefetchWriteBack: the counter reads its value from the frame and writes it back; the host
// applies the write after the call and delivers the area's emits.
func TestPrefetchWriteBack(t *testing.T) {
	in, h := newFast(t, Limits{})
	for i := 1; i <= 3; i++ {
		h.emits = nil
		if err := in.Process([]byte("key"), []byte("c"), 0); err != nil {
			t.Fatal(err)
		}
		if len(h.emits) != 1 || h.emits[0] != [2]string{"key", le64(uint64(i))} {
			t.Fatalf("record %d: emits %q", i, h.emits)
		}
	}
	if got := h.state[sk(0, nil)]; string(got) != le64(3) {
		t.Fatalf("state n = %q", got)
	}
	if err := in.Process([]byte("key"), []byte("d"), 0); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.state[sk(0, nil)]; ok {
		t.Fatal("delete through the frame was not applied")
	}
}

// TestPrefetchFramesCarryValues: a second prefetched state, written through its frame and read
// back; a value larger than the minimum frame arrives whole.
func TestPrefetchFramesCarryValues(t *testing.T) {
	in, h := newFast(t, Limits{})
	if err := in.Process([]byte("k"), []byte("w"), 0); err != nil {
		t.Fatal(err)
	}
	if string(h.state[sk(1, nil)]) != "hi" {
		t.Fatalf("m = %q", h.state[sk(1, nil)])
	}
	// A value larger than the minimum frame arrives whole, with room to grow, and the frames
	// after it are placed past its capacity.
	big := bytes.Repeat([]byte("v"), 300)
	h.state[sk(1, nil)] = big
	h.state[sk(0, nil)] = []byte(le64(41))
	h.emits = nil
	if err := in.Process([]byte("k"), []byte("c"), 0); err != nil {
		t.Fatal(err)
	}
	at := in.pf.at[1]
	if l, _ := in.mem.ReadUint32Le(at); l != 300 {
		t.Fatalf("frame 1 len %d", l)
	}
	if c, _ := in.mem.ReadUint32Le(at + 4); c < 300 || c%8 != 0 {
		t.Fatalf("frame 1 cap %d", c)
	}
	if in.peek(t, at+16, 300) != string(big) {
		t.Fatal("frame 1 value corrupted")
	}
	if string(h.state[sk(1, nil)]) != string(big) || len(h.emits) != 1 || h.emits[0][1] != le64(42) {
		t.Fatalf("state %q, emits %q", h.state[sk(0, nil)], h.emits)
	}
}

func TestOutputAreaFlushKeepsOrder(t *testing.T) {
	in, h := newFast(t, Limits{})
	h.emits = nil
	if err := in.Process([]byte("kkkk"), []byte("o"), 0); err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(h.emits))
	for i, e := range h.emits {
		got[i] = e[1]
	}
	if strings.Join(got, ",") != "AAAAAAAA,BBBBBBBB,CCCCCCCC" {
		t.Fatalf("emits %q", got)
	}
}

func TestFastPathFaults(t *testing.T) {
	cases := []struct{ op, want string }{
		{"b", "over its capacity"},
		{"u", "output area says 61 bytes are used"},
	}
	for _, c := range cases {
		in, _ := newFast(t, Limits{})
		err := in.Process([]byte("k"), []byte(c.op), 0)
		var f *Fault
		if !errors.As(err, &f) || f.Kind != FaultABI || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v", c.op, err)
		}
		if !in.Broken() {
			t.Errorf("%s: instance not broken", c.op)
		}
	}
	// Area emits count against the per-call emit limit.
	in, _ := newFast(t, Limits{MaxEmitsPerCall: 2})
	err := in.Process([]byte("kkkk"), []byte("o"), 0)
	if err == nil || !strings.Contains(err.Error(), "exceeds the emit limits") {
		t.Errorf("emit limit: %v", err)
	}
}

func TestOutputAreaRegistration(t *testing.T) {
	in, _ := newProbe(t, Limits{})
	in.kind = callProcess
	if got := in.outputArea(0, 11); got != i32result(InvalidArgument) {
		t.Errorf("cap 11: %d", int32(got))
	}
	if got := in.outputArea(uint32(in.mem.Size())-4, 12); got != i32result(OutOfBounds) {
		t.Errorf("out of bounds: %d", int32(got))
	}
	if got := in.outputArea(1024, 64); got != 0 || in.outPtr != 1024 || in.outCap != 64 {
		t.Errorf("register: %d", int32(got))
	}
	if got := in.outputArea(0, 0); got != 0 || in.outCap != 0 {
		t.Errorf("unregister: %d", int32(got))
	}
	in.kind = callKey
	if got := in.outputArea(1024, 64); got != i32result(NotAllowed) {
		t.Errorf("in clink_key: %d", int32(got))
	}
	if got := in.flushOutput(); got != i32result(NotAllowed) {
		t.Errorf("flush in clink_key: %d", int32(got))
	}
	in.kind = callNone
}

func TestManifestPrefetchValidation(t *testing.T) {
	for _, c := range []struct{ json, want string }{
		{`{"abi":1,"name":"x","states":["a"],"prefetch":["b"]}`, `prefetches "b", which is not among its states`},
		{`{"abi":1,"name":"x","states":["a"],"prefetch":["a","a"]}`, `declares prefetch name "a" twice`},
	} {
		if _, err := ParseManifest([]byte(c.json)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.json, err)
		}
	}
}

// TestDrainFaultCancelsWriteBack: a call whose output area faults at drain time leaves no state
// written (the frames are applied only after a successful drain).
func TestDrainFaultCancelsWriteBack(t *testing.T) {
	in, h := newFast(t, Limits{MaxEmitValue: 4}) // the counter's 8-byte emit is over the limit
	err := in.Process([]byte("key"), []byte("c"), 0)
	if err == nil || !strings.Contains(err.Error(), "exceeds the emit limits") {
		t.Fatalf("got %v", err)
	}
	if _, ok := h.state[sk(0, nil)]; ok {
		t.Fatal("the failed call's frame write was applied")
	}
}

// TestPrefetchTooLarge: a value over the prefetch limit is not carried in the frame; the frame
// says so and the guest reads it with get_async.
func TestPrefetchTooLarge(t *testing.T) {
	in, h := newFast(t, Limits{MaxPrefetchValue: 100})
	h.state[sk(1, nil)] = bytes.Repeat([]byte("z"), 101)
	if err := in.Process([]byte("k"), []byte("c"), 0); err != nil {
		t.Fatal(err)
	}
	if l, _ := in.mem.ReadUint32Le(in.pf.at[1]); l != frameTooLarge {
		t.Fatalf("frame 1 len %#x, want the too-large marker", l)
	}
	if c, _ := in.mem.ReadUint32Le(in.pf.at[1] + 4); c != frameMinCap {
		t.Fatalf("frame 1 cap %d", c)
	}
}
