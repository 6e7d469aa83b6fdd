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

// slotHandler is a recHandler whose Emit reports that its call is inside the guest and waits
// for release, holding the call's running slot, or giving it up when blocking is set.
type slotHandler struct {
	*recHandler
	in       *Instance
	blocking bool
	entered  chan struct{}
	release  chan struct{}
}

func (h *slotHandler) Emit(key, value []byte) error {
	close(h.entered)
	if h.blocking {
		return h.in.Blocking(func() error { <-h.release; return nil })
	}
	<-h.release
	return nil
}

// TestCPUShareRunningSlots: a share of c cores lets at most ⌈c⌉ of its guests run at the same
// instant. With one core, a second call waits while the first is inside its guest code (here
// in a host call that holds on), and runs once it returns; a call that blocks through
// Instance.Blocking gives its slot up meanwhile; with two cores both run at once.
func TestCPUShareRunningSlots(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cores    float64
		blocking bool
		together bool // the second call runs while the first holds on
		peak     int
	}{
		{"one core", 1, false, false, 1},
		{"a quarter core", 0.25, false, false, 1},
		{"one core, blocking", 1, true, true, 1},
		{"two cores", 2, false, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sh := NewCPUShare(tc.cores)
			e, err := NewEngine(t.Context(), WithCPUShare(sh))
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close(t.Context())
			m := load(t, e, "counter")
			h := &slotHandler{recHandler: newRec(), blocking: tc.blocking, entered: make(chan struct{}), release: make(chan struct{})}
			first, err := m.Instantiate(t.Context(), h)
			if err != nil {
				t.Fatal(err)
			}
			defer first.Close(t.Context())
			h.in = first
			second, err := m.Instantiate(t.Context(), newRec())
			if err != nil {
				t.Fatal(err)
			}
			defer second.Close(t.Context())

			firstDone := make(chan error, 1)
			go func() { firstDone <- first.Process([]byte("a"), nil, 0) }()
			<-h.entered
			secondDone := make(chan error, 1)
			go func() { secondDone <- second.Process([]byte("b"), nil, 0) }()
			if tc.together {
				select {
				case err := <-secondDone:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(time.Minute): // a bound on the wait, not a measurement
					close(h.release)
					t.Fatal("the second call could not run while the first held on")
				}
			} else {
				// Wait until the second call waits for a slot (bounded), then check it has not run.
				waitForWaiter(t, sh, "the second call never waited for a running slot")
				select {
				case err := <-secondDone:
					t.Fatalf("the second call ran (%v) while the first held the share's only slot", err)
				default:
				}
			}
			close(h.release)
			if err := <-firstDone; err != nil {
				t.Fatal(err)
			}
			if !tc.together {
				if err := <-secondDone; err != nil {
					t.Fatal(err)
				}
			}
			if p := sh.PeakRunning(); p != tc.peak {
				t.Fatalf("peak running guests %d, want %d", p, tc.peak)
			}
			sh.mu.Lock()
			defer sh.mu.Unlock()
			if sh.running != 0 || sh.waiting != 0 {
				t.Fatalf("after both calls: %d running, %d waiting", sh.running, sh.waiting)
			}
		})
	}
}

// TestCPUShareSlotsFollowSetCores: a call waiting for a slot runs as soon as a live change
// gives the share more cores, and a waiting call gives up when its instance's context ends.
func TestCPUShareSlotsFollowSetCores(t *testing.T) {
	sh := NewCPUShare(1)
	if !sh.enter(nil) {
		t.Fatal("a share of one core gave no slot")
	}
	got := make(chan bool, 1)
	go func() { got <- sh.enter(nil) }()
	waitForWaiter(t, sh, "the second enter never waited")
	sh.SetCores(2)
	if !<-got {
		t.Fatal("the waiting enter did not get the slot SetCores(2) added")
	}
	done := make(chan struct{})
	go func() { got <- sh.enter(done) }()
	close(done)
	if <-got {
		t.Fatal("an enter at the limit whose done channel closed still took a slot")
	}
	sh.SetCores(0)
	if sh.enter(nil) {
		t.Fatal("an unlimited share counted a running slot")
	}
	sh.leave()
	sh.leave()
	if sh.running != 0 {
		t.Fatalf("running %d after leaving both", sh.running)
	}
}

// TestCPUShareSlotsNoStarvation: with one slot, a call that has not waited may take a free slot
// ahead of a waiting one only until that one has waited a share period; then only a woken
// waiter may, and the barger queues behind it and gets the slot when it is given back.
func TestCPUShareSlotsNoStarvation(t *testing.T) {
	sh := NewCPUShare(1)
	sh.mu.Lock()
	sh.waiting, sh.waitSince = 1, time.Hour
	if !sh.admitLocked(false, time.Hour+cpuSharePeriod/2) {
		t.Error("a free slot was refused to a barger before the waiter had waited a share period")
	}
	if sh.admitLocked(false, time.Hour+cpuSharePeriod) {
		t.Error("a barger took a free slot from a waiter that had waited a share period")
	}
	if !sh.admitLocked(true, time.Hour+cpuSharePeriod) {
		t.Error("a woken waiter was refused a free slot")
	}
	sh.running = 1
	if sh.admitLocked(true, time.Hour) {
		t.Error("a slot was given beyond the share's one")
	}
	sh.waiting, sh.running = 0, 0
	sh.mu.Unlock()

	// The same with goroutines: B waits; A, in a loop of leave and enter, is refused once B
	// has waited a period and queues behind B, which runs.
	if !sh.enter(nil) {
		t.Fatal("no slot")
	}
	bGot := make(chan struct{})
	bLeave := make(chan struct{})
	go func() {
		if sh.enter(nil) {
			close(bGot)
			<-bLeave
			sh.leave()
		}
	}()
	waitForWaiter(t, sh, "B never waited")
	aGot := make(chan struct{})
	go func() {
		for i := 0; i < 100_000_000; i++ {
			sh.leave()
			sh.enter(nil)
			select {
			case <-bGot: // B ran: A's enter above returned after B gave the slot back
				close(aGot)
				return
			default:
			}
		}
	}()
	<-bGot
	sh.mu.Lock()
	running := sh.running
	sh.mu.Unlock()
	if running != 1 {
		t.Fatalf("%d running while B holds the share's one slot", running)
	}
	close(bLeave)
	select {
	case <-aGot:
	case <-time.After(time.Minute): // a bound on the wait, not a measurement
		t.Fatal("A never got the slot back after B left")
	}
	sh.leave()
}

// waitForWaiter waits (bounded) until one enter waits for a running slot of sh; what says what
// did not happen if it never does.
func waitForWaiter(t *testing.T, sh *CPUShare, what string) {
	t.Helper()
	for i := 0; ; i++ {
		sh.mu.Lock()
		w := sh.waiting
		sh.mu.Unlock()
		if w == 1 {
			return
		}
		if i == 10_000 {
			t.Fatal(what)
		}
		time.Sleep(time.Millisecond)
	}
}
