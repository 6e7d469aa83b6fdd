//go:build !wasip1

package clink

import (
	"testing"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"
)

// TestHotPathAllocatesNothing checks that the counter example's per-record work through the
// SDK allocates nothing: a prefetched int64 read and written in its frame, JSON built with
// jsonx in a reused buffer, and an Emit into the output area, inside the process export. So the
// Go collector, which is slow in a Wasm guest, never runs on that path. It calls the export the
// way the host does, with the record and the two test states' frames in the input buffer and
// no harness around it, and compares with a command that does nothing (the test operator's
// command parsing allocates the same in both).
func TestHotPathAllocatesNothing(t *testing.T) {
	key := []byte("user-1")
	run := func(cmd string) float64 {
		t.Helper()
		value := []byte(cmd)
		kl, vl := uint32(len(key)), uint32(len(value))
		off := abi.Align8(kl + vl)
		abi.GrowInput(off + uint32(len(prefetched))*(abi.FrameHeader+abi.FrameMinCap))
		copy(abi.Input, key)
		copy(abi.Input[kl:], value)
		for i := range prefetched {
			h := abi.Input[off+uint32(i)*(abi.FrameHeader+abi.FrameMinCap):]
			clear(h[:abi.FrameHeader+abi.FrameMinCap])
			abi.PutLe32(h, 8) // an 8-byte value: the count, 0
			abi.PutLe32(h[4:], abi.FrameMinCap)
		}
		abi.Host.Call, abi.Host.Key = abi.CallProcess, string(key)
		defer func() { abi.Host.Call = abi.CallNone }()
		return testing.AllocsPerRun(200, func() {
			if rc := process(kl, vl, 0); rc != 0 {
				t.Fatalf("process %q: rc %d", cmd, rc)
			}
			if area != nil {
				abi.PutLe32(area, 0) // the host drains the area after each call
			}
		})
	}
	base, hot := run("nop"), run("hot")
	if hot != base {
		t.Errorf("the counter's work allocates %v times a record (%v with it, %v for a command that does nothing)", hot-base, hot, base)
	}
	if areaState != 1 {
		t.Errorf("the output area was not used (state %d)", areaState)
	}
}
