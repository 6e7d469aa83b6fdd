package abi

import (
	"errors"
	"testing"
	"time"
)

// TestCPUShareCharge checks the share's clock with explicit times: within the idle credit a
// charge pauses nothing; past it the pause is the overdraft over the cores; two guests that
// overdraw one share are spaced one after the other; a live change of cores applies to the
// next charge; and <= 0 cores never pauses.
func TestCPUShareCharge(t *testing.T) {
	ms := time.Millisecond
	c := NewCPUShare(1)
	now := time.Hour
	if p, _ := c.charge(ms, now); p != 0 {
		t.Fatalf("a first charge of 1 ms within the %v credit paused %v", cpuShareBurst, p)
	}
	if p, _ := c.charge(3*ms, now); p != 2*ms {
		t.Fatalf("4 ms charged at once with 2 ms of credit: pause %v, want 2ms", p)
	}
	// A second guest charging right after is queued behind the first.
	if p, _ := c.charge(ms, now); p != 3*ms {
		t.Fatalf("the second guest's pause %v, want 3ms (behind the first)", p)
	}
	// After a long idle time only cpuShareBurst of credit remains.
	now += time.Minute
	if p, _ := c.charge(cpuShareBurst+ms, now); p != ms {
		t.Fatalf("after idling: pause %v, want 1ms", p)
	}
	// Half a core: every charge costs twice its time.
	c.setCores(0.5, now)
	now += time.Minute
	if p, _ := c.charge(2*ms, now); p != 2*ms {
		t.Fatalf("at 0.5 cores: pause %v, want 2ms", p)
	}
	// A live change applies to what is owed: 4 ms of debt at 0.5 cores (2 ms of guest time)
	// is owed for 1 ms at 2 cores, and a guest paused at the old rate is woken.
	now += time.Minute
	if p, _ := c.charge(cpuShareBurst/2+2*ms, now); p != 4*ms {
		t.Fatalf("at 0.5 cores: pause %v, want 4ms", p)
	}
	_, changed := c.charge(0, now)
	c.setCores(2, now)
	select {
	case <-changed:
	default:
		t.Fatal("SetCores did not wake the guests paused at the old rate")
	}
	if p, _ := c.charge(0, now); p != ms {
		t.Fatalf("4 ms owed at 0.5 cores, now at 2 cores: pause %v, want 1ms", p)
	}
	c.setCores(0, now)
	if p, _ := c.charge(time.Second, now); p != 0 || c.Cores() != 0 {
		t.Fatalf("an unlimited share paused %v", p)
	}
}

// TestCPUSharePauseIsNotCallTime: a guest throttled by its share is paused, and the paused
// time does not count against its call time limit: a runaway call at a tenth of a core runs
// its 100 ms limit of its own time, paused some 900 ms on the way, before it fails.
func TestCPUSharePauseIsNotCallTime(t *testing.T) {
	sh := NewCPUShare(0.1)
	e, err := NewEngine(t.Context(), WithCPUShare(sh), WithLimits(Limits{CallTime: 100 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(t.Context())
	m := load(t, e, "loop")
	in, err := m.Instantiate(t.Context(), newRec())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close(t.Context())
	err = in.Process([]byte("k"), nil, 0)
	var f *Fault
	if !errors.As(err, &f) || f.Kind != FaultTimeLimit {
		t.Fatalf("want a time-limit fault, got %v", err)
	}
	if u := sh.Used(); u < 100*time.Millisecond {
		t.Fatalf("the call ran %v of its own time (paused %v) before failing its 100 ms limit: paused time counted as running", u, sh.Paused())
	}
}
