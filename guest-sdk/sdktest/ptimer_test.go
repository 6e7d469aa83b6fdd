package sdktest

import (
	"testing"
)

// ptHandler is the test handler serving processing-time timers too.
type ptHandler struct {
	*handler
	ptimers map[string]map[int64]bool // record key -> processing times
}

func (h *ptHandler) RegisterProcessingTimer(ts int64) error {
	if h.ptimers[h.key] == nil {
		h.ptimers[h.key] = map[int64]bool{}
	}
	h.ptimers[h.key][ts] = true
	return nil
}

func (h *ptHandler) DeleteProcessingTimer(ts int64) error {
	delete(h.ptimers[h.key], ts)
	return nil
}

// TestGoProcessingTimers runs the Go SDK's package clink/ptimer in a real module through the
// production host: Register and Delete reach the host, the module exports
// clink_on_processing_timer, and a fired processing-time timer runs OnTimer in its key's
// context with ptimer.Fired() true, an event-time one with it false.
func TestGoProcessingTimers(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the Go module")
	}
	m := module(t, "../testdata/ptimer/ptimer-go.wasm")
	if !m.HasOnProcessingTimer() {
		t.Fatal("the module does not export clink_on_processing_timer")
	}
	h := &ptHandler{handler: newHandler(t), ptimers: map[string]map[int64]bool{}}
	in, err := m.Instantiate(t.Context(), h)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close(t.Context())
	call := func(key string, f func() error) []output {
		t.Helper()
		h.key, h.out = key, nil
		if err := f(); err != nil {
			t.Fatalf("key %s: %v", key, err)
		}
		return h.out
	}
	for _, c := range []struct{ key, cmd string }{{"a", "reg 100"}, {"a", "timer 50"}, {"b", "reg 200"}, {"b", "del 200"}, {"a", "reg 300"}} {
		call(c.key, func() error { return in.Process([]byte(c.key), []byte(c.cmd), 0) })
	}
	if len(h.ptimers["a"]) != 2 || !h.ptimers["a"][100] || !h.ptimers["a"][300] || len(h.ptimers["b"]) != 0 {
		t.Fatalf("processing-time timers %v", h.ptimers)
	}
	if len(h.timers["a"]) != 1 || !h.timers["a"][50] {
		t.Fatalf("event-time timers %v", h.timers)
	}
	out := call("a", func() error { return in.OnProcessingTimer([]byte("a"), 100) })
	if len(out) != 1 || out[0].key != "a" || out[0].value != `{"ptimer":true,"ts":100,"n":3}` {
		t.Fatalf("processing-time timer: %+v", out)
	}
	out = call("a", func() error { return in.OnTimer([]byte("a"), 50) })
	if len(out) != 1 || out[0].value != `{"ptimer":false,"ts":50,"n":3}` {
		t.Fatalf("event-time timer after a processing-time one: %+v", out)
	}
}
