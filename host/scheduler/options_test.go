package scheduler

import (
	"testing"
	"time"
)

// TestOptionsDefaults: defaults come from defaultConfig, a later option wins, and values that
// mean "the default" (zero, negative) are replaced by it once, in New.
func TestOptionsDefaults(t *testing.T) {
	build := func(opts ...Option) config {
		cfg := defaultConfig()
		for _, o := range opts {
			o.apply(&cfg)
		}
		cfg.normalize()
		return cfg
	}
	d := build()
	if d.ReadBatch != 32 || d.MaxReadBatch != 4096 || d.TimerLimit != 65536 || d.Logger == nil ||
		d.InstanceMemoryBudget != DefaultInstanceMemoryBudget() || d.Describe(7) != "record #7" || d.NoCoalesce {
		t.Errorf("defaults: %+v", d)
	}
	c := build(WithReadBatch(64, 16), WithMaxInFlight(-3), WithTimerLimit(0), WithLogger(nil),
		WithCoalescing(false), WithReadBatchWait(time.Millisecond), WithMaxInFlight(9), WithMaxInFlight(0))
	if c.ReadBatch != 16 || c.MaxReadBatch != 16 {
		t.Errorf("WithReadBatch(64, 16): batch %d, max %d; want both 16", c.ReadBatch, c.MaxReadBatch)
	}
	if c.MaxInFlight != 0 || c.TimerLimit != 65536 || c.Logger == nil || !c.NoCoalesce || c.ReadBatchWait != time.Millisecond {
		t.Errorf("got %+v", c)
	}
	if c := build(WithMaxInFlight(9)); c.MaxInFlight != 9 {
		t.Errorf("WithMaxInFlight(9): %d", c.MaxInFlight)
	}
	if _, err := New(nil, nil, nil); err == nil {
		t.Error("New without a module, backend and sink succeeded")
	}
}
