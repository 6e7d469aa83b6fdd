package clink_test

import (
	"strconv"
	"testing"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/clinktest"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/ptimer"
)

// processingTimerCmd serves the test operator's "ptimer T" (register at processing time
// now + T) and "unptimer T" (delete the timer at now + T).
func processingTimerCmd(cmd, arg string) error {
	d, _ := strconv.ParseInt(arg, 10, 64)
	if cmd == "unptimer" {
		return ptimer.Delete(clink.ProcessingTime() + d)
	}
	return ptimer.Register(clink.ProcessingTime() + d)
}

// TestProcessingTimers: timers fire when the processing time reaches them, in time order,
// once per (key, time), not at all once deleted, and never because of the watermark.
func TestProcessingTimers(t *testing.T) {
	h, err := clinktest.New()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.AdvanceProcessingTime(10_000); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ key, cmd string }{{"a", "ptimer 500"}, {"b", "ptimer 200"}, {"a", "ptimer 500"}, {"c", "ptimer 300"}, {"c", "unptimer 300"}} {
		if _, err := h.Process([]byte(c.key), []byte(c.cmd), 0); err != nil {
			t.Fatalf("%s %s: %v", c.key, c.cmd, err)
		}
	}
	if out, err := h.AdvanceWatermark(1 << 62); err != nil || len(out) != 0 {
		t.Fatalf("the watermark fired processing-time timers: %v %v", out, err)
	}
	out, err := h.AdvanceProcessingTime(10_199)
	if err != nil || len(out) != 0 {
		t.Fatalf("fired early: %v %v", out, err)
	}
	out, err = h.AdvanceProcessingTime(11_000)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range out {
		got = append(got, string(o.Key)+" "+string(o.Value))
	}
	want := []string{`b {"ptimer":10200,"now":11000}`, `a {"ptimer":10500,"now":11000}`}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %q, want %q", got, want)
	}
	if out, err := h.AdvanceProcessingTime(20_000); err != nil || len(out) != 0 {
		t.Fatalf("a timer fired twice: %v %v", out, err)
	}
}
