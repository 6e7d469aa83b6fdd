package kafka

import (
	"testing"
	"time"
)

func TestWatermarks(t *testing.T) {
	t0 := time.Unix(0, 0)
	a, b := Split{"t", 0}, Split{"t", 1}
	w := NewWatermarks(100*time.Millisecond, time.Second)
	w.Add(a, t0)
	w.Add(b, t0)
	w.Observe(a, 1000, t0)
	if wm, idle := w.Current(t0); wm != NoWatermark || idle {
		t.Fatalf("b has seen nothing and is not idle: wm %d idle %v", wm, idle)
	}
	w.Observe(b, 500, t0)
	if wm, _ := w.Current(t0); wm != 399 {
		t.Fatalf("min(999-100, 499-100): got %d", wm)
	}
	if got := w.Split(a); got != 899 {
		t.Fatalf("split a: %d", got)
	}
	// b goes idle: a alone decides.
	w.Observe(a, 2000, t0.Add(900*time.Millisecond))
	if wm, idle := w.Current(t0.Add(1500 * time.Millisecond)); wm != 1899 || idle {
		t.Fatalf("b idle: wm %d idle %v", wm, idle)
	}
	// b comes back with old times: the watermark does not go back.
	w.Observe(b, 600, t0.Add(1600*time.Millisecond))
	if wm, _ := w.Current(t0.Add(1600 * time.Millisecond)); wm != 1899 {
		t.Fatalf("watermark went back to %d", wm)
	}
	// Everything idle: the source is idle and keeps what it had.
	if wm, idle := w.Current(t0.Add(10 * time.Second)); !idle || wm != 1899 {
		t.Fatalf("all idle: wm %d idle %v", wm, idle)
	}
	// No idleness configured: a silent split holds the watermark forever.
	n := NewWatermarks(0, 0)
	n.Add(a, t0)
	n.Add(b, t0)
	n.Observe(a, 10, t0)
	if wm, idle := n.Current(t0.Add(time.Hour)); wm != NoWatermark || idle {
		t.Fatalf("no idleness: wm %d idle %v", wm, idle)
	}
}
