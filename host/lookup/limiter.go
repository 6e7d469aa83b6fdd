package lookup

import (
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"time"
)

// limiter is an endpoint's adaptive concurrency limit with a bounded FIFO queue.
//
// Requests over the limit wait in the queue without holding a goroutine: a releasing
// attempt hands its slot to the queue head (and runs it on its own goroutine when it can), and
// one timer per limiter expires entries that waited longer than the queue timeout.
//
// # Controller
//
// The default controller, "gradient", steers by the delivered rate in phases of its own
// (gradient.go). The latency controllers: every Window the controller compares the mean
// attempt latency with a setpoint and moves the limit: "pid" runs the seed's PID controller (with anti-windup and a clamped output) on the
// logarithms, so the gains do not depend on the scale of latency or limit; "aimd" adds one
// per round trip's worth of fast responses and multiplies by 0.9 per slow window.
//
// The setpoint is TargetLatency if configured, else Tolerance × baseline. The baseline is the
// median latency measured during a probe, a short phase where the limit is pinned to MinLimit
// so that the upstream has no queue of ours in it (as Envoy's adaptive-concurrency filter
// does). A latency-based limiter cannot otherwise tell "the upstream got slower" from "we are
// queueing in it": the first calls for a higher limit, the second for a lower one. So the
// baseline is re-measured every ProbeInterval, and early when latency stays above the
// setpoint for a second although the limit has come down: if the upstream itself slowed,
// the probe sees it, the setpoint moves, and the limit climbs back.
//
// INVARIANT: inflight counts slots handed out and not yet released; inflight ≤ capacity()
// except transiently after the capacity drops, when releases do not dispatch.
type limiter struct {
	mu sync.Mutex

	algorithm    string
	maxLimit     float64
	minLimit     float64
	maxQueued    int
	queueTimeout time.Duration
	window       time.Duration
	target       time.Duration
	tolerance    float64
	probeEvery   time.Duration

	limit    float64
	inflight int
	head     *call // FIFO of waiting calls, linked through call.qnext/qprev
	tail     *call
	queued   int
	timer    *time.Timer // expires the queue head; armed while the queue is not empty
	closed   bool

	// controller state
	pid          pid
	baseline     time.Duration
	probing      bool
	probeEpoch   uint64 // attempts acquired in this epoch at low concurrency count as probe samples
	probeStart   time.Time
	probeSamples []time.Duration
	savedLimit   float64
	nextProbe    time.Time
	lastProbe    time.Time
	slowWindows  int
	winStart     time.Time
	winN         int
	winSum       time.Duration
	winOverload  int
	winPeak      int // peak in-flight during the window, to detect an application-limited window
	changes      uint64
	sched        schedLatency  // the client's own run-queue wait, taken out of each window's mean
	lastSched    time.Duration // its mean over the last window, for per-sample decisions
	slowStart    bool          // from the start until the first slow or overloaded window
	grad         gradient      // the "gradient" controller's phases (gradient.go)
}

const (
	probeSamples   = 10
	probeMaxTime   = time.Second
	slowWindowsMax = 5 // slow windows in a row before an early probe
	minWindowN     = 5
)

func newLimiter(cfg *EndpointConfig) *limiter {
	k := cfg.Concurrency
	l := &limiter{
		algorithm:    k.Algorithm,
		maxLimit:     float64(cfg.MaxInFlight),
		minLimit:     float64(k.MinLimit),
		maxQueued:    cfg.MaxQueued,
		queueTimeout: time.Duration(cfg.QueueTimeout),
		window:       time.Duration(k.Window),
		target:       time.Duration(k.TargetLatency),
		tolerance:    k.Tolerance,
		probeEvery:   time.Duration(k.ProbeInterval),
		limit:        float64(k.InitialLimit),
	}
	if l.algorithm == "fixed" {
		l.limit = l.maxLimit
	}
	// Gains per second of the log-limit; see DESIGN.md for the step responses they give.
	l.pid = pid{kp: 0.3, ki: 5, kd: 0, outMin: math.Log(l.minLimit), outMax: math.Log(l.maxLimit)}
	l.pid.integral = math.Log(l.limit)
	now := time.Now()
	l.winStart = now
	if (l.algorithm == "pid" || l.algorithm == "aimd") && l.target == 0 {
		l.startProbe(now) // measure the baseline before steering by it
	}
	l.slowStart = l.algorithm == "pid" || l.algorithm == "aimd"
	if l.algorithm == "gradient" {
		l.grad.init(l, now)
	}
	return l
}

func (l *limiter) capacity() int {
	if l.probing {
		return int(l.minLimit)
	}
	if l.algorithm == "gradient" {
		return l.grad.cap
	}
	return int(l.limit)
}

// acquire gives c a slot (true) or queues it (false). It fails c's request with an error if
// the queue is full.
func (l *limiter) acquire(c *call) (bool, *Error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false, &Error{Kind: KindCancelled, Reason: "endpoint closed", notSent: true}
	}
	if l.head == nil && l.inflight < l.capacity() {
		l.take(c)
		l.mu.Unlock()
		return true, nil
	}
	if l.queued >= l.maxQueued {
		l.mu.Unlock()
		return false, &Error{Kind: KindUnavailable, Reason: "endpoint queue full", notSent: true}
	}
	c.qAt = time.Now()
	c.qprev, c.qnext = l.tail, nil
	if l.tail != nil {
		l.tail.qnext = c
	} else {
		l.head = c
	}
	l.tail = c
	c.queued = true
	l.queued++
	if l.head == c {
		l.armLocked(c.qAt)
	}
	l.mu.Unlock()
	return false, nil
}

func (l *limiter) take(c *call) {
	l.inflight++
	l.winPeak = max(l.winPeak, l.inflight)
	c.epoch = 0
	switch {
	case l.probing:
		c.epoch = l.probeEpoch
	case l.algorithm == "gradient":
		c.epoch = l.grad.seq // the phase it was sent in
	}
}

func (l *limiter) unlinkLocked(c *call) {
	if c.qprev != nil {
		c.qprev.qnext = c.qnext
	} else {
		l.head = c.qnext
	}
	if c.qnext != nil {
		c.qnext.qprev = c.qprev
	} else {
		l.tail = c.qprev
	}
	c.qprev, c.qnext, c.queued = nil, nil, false
	l.queued--
}

// remove takes c out of the queue; it reports whether c was queued (and so is now owned by
// the caller).
func (l *limiter) remove(c *call) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !c.queued {
		return false
	}
	l.unlinkLocked(c)
	return true
}

func (l *limiter) armLocked(from time.Time) {
	d := l.queueTimeout - time.Since(from)
	if l.timer == nil {
		l.timer = time.AfterFunc(max(d, 0), l.expire)
	} else {
		l.timer.Reset(max(d, 0))
	}
}

// expire fails queue entries that waited longer than the queue timeout.
func (l *limiter) expire() {
	var dead []*call
	l.mu.Lock()
	now := time.Now()
	for c := l.head; c != nil && now.Sub(c.qAt) >= l.queueTimeout; c = l.head {
		l.unlinkLocked(c)
		dead = append(dead, c)
	}
	if l.head != nil {
		l.armLocked(l.head.qAt)
	}
	l.mu.Unlock()
	for _, c := range dead {
		c.attemptFailed(&Error{Kind: KindTimeout, Reason: "queued longer than queue_timeout", notSent: true}, false)
	}
}

// sample is the outcome of one attempt, for the controller.
type sample struct {
	rtt      time.Duration
	valid    bool // a response or a transport failure; not a refusal or cancellation
	noRTT    bool // a failure whose duration says nothing about latency (connection refused)
	overload bool // timeout, 429, 503: the upstream is asking us to back off
	epoch    uint64
}

// release returns a slot, feeds the controller, and hands freed slots to queued calls. It
// returns one call for the caller to run on its own goroutine (saving a goroutine start);
// others are started on new goroutines.
func (l *limiter) release(s sample) (next *call) {
	l.mu.Lock()
	l.inflight--
	if s.valid && l.algorithm != "fixed" {
		l.observeLocked(s, time.Now())
	}
	var extra []*call
	for l.head != nil && l.inflight < l.capacity() {
		c := l.head
		l.unlinkLocked(c)
		l.take(c)
		if next == nil {
			next = c
		} else {
			extra = append(extra, c)
		}
	}
	if l.head == nil && l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	for _, c := range extra {
		go c.send()
	}
	return next
}

// observeLocked is the controller. It runs under l.mu on the releasing goroutine: no
// goroutine or ticker of its own.
func (l *limiter) observeLocked(s sample, now time.Time) {
	if l.probing {
		if s.epoch == l.probeEpoch && !s.overload && !s.noRTT {
			l.probeSamples = append(l.probeSamples, s.rtt)
		}
		if len(l.probeSamples) >= probeSamples || now.Sub(l.probeStart) > probeMaxTime {
			l.endProbe(now)
		}
		return
	}
	if l.algorithm == "gradient" {
		l.observeGradient(s, now)
		return
	}
	if s.overload {
		l.winOverload++
	}
	if s.noRTT {
		return
	}
	l.winN++
	l.winSum += s.rtt
	setpoint := l.setpoint()
	if l.slowStart && !s.overload && s.rtt <= setpoint+l.lastSched && float64(l.inflight+1) >= l.limit/2 {
		// Slow start, as TCP's: +1 per fast response doubles the limit every round trip,
		// so a job reaches its working limit in a few round trips instead of a few windows
		// (the controller's windows are 100 ms; a 20k-record job lasts about half a second).
		l.limit = min(l.maxLimit, l.limit+1)
	}
	if l.algorithm == "aimd" && !s.overload && s.rtt <= setpoint && float64(l.winPeak) >= l.limit/2 {
		l.limit = min(l.maxLimit, l.limit+1/l.limit) // +1 per round trip of fast responses
	}
	dt := now.Sub(l.winStart)
	if dt < l.window || (l.winN < minWindowN && dt < 10*l.window) {
		return
	}
	var mean time.Duration
	switch {
	case l.winN > 0:
		// The samples are the upstream's share of each attempt; each holds one wake-up of
		// the client's reading goroutine, whose mean run-queue wait is the client's.
		mean = l.winSum / time.Duration(l.winN)
		l.lastSched = l.sched.since()
		mean = max(mean-l.lastSched, mean/2)
	case l.winOverload > 0:
		mean = 2 * setpoint // only failures: treat as congestion
	default:
		return
	}
	overloaded := l.winOverload*20 >= l.winN+l.winOverload // ≥ ~5% overload signals
	before := int(l.limit)
	if l.slowStart && (mean > setpoint || overloaded) {
		l.slowStart = false // the first slow window: the controller takes over from here
		l.pid.reset(math.Log(l.limit))
	}
	switch {
	case l.slowStart:
		// growing per sample (above)
	case l.algorithm == "pid":
		e := math.Log(float64(setpoint) / float64(max(mean, 1)))
		if overloaded {
			e = min(e, -math.Ln2)
		}
		if e > 0 && float64(l.winPeak) < l.limit/2 {
			e = 0 // application-limited: no evidence that more concurrency is safe
		}
		l.limit = math.Exp(l.pid.update(e, dt.Seconds()))
	case l.algorithm == "aimd":
		if mean > setpoint || overloaded {
			l.limit = max(l.minLimit, l.limit*0.9)
		}
	}
	if int(l.limit) != before {
		l.changes++
	}

	// Slow: clearly above the setpoint, or above it with the limit already at its floor.
	// Either way lowering the limit did not bring latency down, so the upstream itself may
	// have slowed. (Hovering just above the setpoint is normal for aimd and does not count.)
	if l.target == 0 && (mean > setpoint*5/4 || (mean > setpoint && l.limit <= l.minLimit)) {
		l.slowWindows++
	} else {
		l.slowWindows = 0
	}
	l.winStart, l.winN, l.winSum, l.winOverload, l.winPeak = now, 0, 0, 0, l.inflight
	if l.target == 0 && (now.After(l.nextProbe) ||
		(l.slowWindows >= slowWindowsMax && now.Sub(l.lastProbe) > 2*time.Second)) {
		l.startProbe(now)
	}
}

func (l *limiter) setpoint() time.Duration {
	if l.target > 0 {
		return l.target
	}
	return time.Duration(float64(l.baseline) * l.tolerance)
}

func (l *limiter) startProbe(now time.Time) {
	l.sched.since() // the probe's wait starts now
	l.probing = true
	l.probeEpoch++
	l.probeStart = now
	l.probeSamples = l.probeSamples[:0]
	l.savedLimit = l.limit
}

func (l *limiter) endProbe(now time.Time) {
	if n := len(l.probeSamples); n > 0 {
		sort.Slice(l.probeSamples, func(i, j int) bool { return l.probeSamples[i] < l.probeSamples[j] })
		b := l.probeSamples[n/2]
		l.baseline = max(b-l.sched.since(), b/2, time.Microsecond) // as the windows' means
	}
	if l.baseline == 0 {
		// No sample (an idle endpoint): keep probing until traffic arrives.
		l.probeStart = now
		return
	}
	l.probing = false
	l.limit = l.savedLimit
	l.pid.reset(math.Log(l.limit))
	l.lastProbe = now
	jitter := 0.85 + 0.3*rand.Float64()
	l.nextProbe = now.Add(time.Duration(float64(l.probeEvery) * jitter))
	l.slowWindows = 0
	l.winStart, l.winN, l.winSum, l.winOverload, l.winPeak = now, 0, 0, 0, l.inflight
	l.sched.since() // the first window's wait starts now
}

// close fails every queued call with KindCancelled.
func (l *limiter) close() {
	l.mu.Lock()
	l.closed = true
	var dead []*call
	for c := l.head; c != nil; c = l.head {
		l.unlinkLocked(c)
		dead = append(dead, c)
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	for _, c := range dead {
		c.attemptFailed(&Error{Kind: KindCancelled, Reason: "endpoint closed", notSent: true}, false)
	}
}

type limiterStats struct {
	limit, inflight, queued int
	baseline, setpoint      time.Duration
	changes                 uint64
}

func (l *limiter) stats() limiterStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := limiterStats{limit: l.capacity(), inflight: l.inflight, queued: l.queued, baseline: l.baseline, changes: l.changes}
	switch {
	case l.algorithm == "gradient":
		s.setpoint = l.target // steering by throughput; a configured latency is its ceiling
		if !l.probing {
			s.limit = int(l.limit) // the limit its probing phases move the capacity around
		}
	case l.algorithm != "fixed":
		s.setpoint = l.setpoint()
	}
	return s
}

// pid is a textbook PID controller with a clamped output and conditional-integration
// anti-windup: the integral does not grow while the output is saturated in its direction.
// It is a port of the seed's PidController.
type pid struct {
	kp, ki, kd     float64
	outMin, outMax float64
	integral       float64
	prevErr        float64
	primed         bool
}

func (p *pid) update(e, dt float64) float64 {
	deriv := 0.0
	if p.primed && dt > 0 {
		deriv = (e - p.prevErr) / dt
	}
	p.prevErr, p.primed = e, true
	i := p.integral + p.ki*e*dt
	out := p.kp*e + i + p.kd*deriv
	switch {
	case out > p.outMax:
		out = p.outMax
		if e > 0 {
			i = p.integral // hold: integrating further would only wind up
		}
	case out < p.outMin:
		out = p.outMin
		if e < 0 {
			i = p.integral
		}
	}
	p.integral = min(max(i, p.outMin), p.outMax)
	return out
}

func (p *pid) reset(integral float64) {
	p.integral, p.prevErr, p.primed = integral, 0, false
}
