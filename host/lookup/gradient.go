package lookup

import (
	"math"
	"time"
)

// gradient is the default controller: it steers the limit by the upstream's delivered rate
// instead of its latency.
//
// A latency setpoint (pid, aimd) cannot tell an upstream with a fixed pool of workers, whose
// latency grows as fast as the concurrency once the pool is busy (more concurrency buys no
// throughput, only queue), from one that shares its CPU among its requests, whose latency
// grows more slowly than the concurrency and whose throughput keeps growing: at 1.5 × the
// unloaded latency the second still gives 20-40% more at twice the concurrency (issue 11's
// enrichment job over h2c: pid settled near 100 of 256 and delivered 0.74-0.81 of a fixed
// limit of 256). What tells them apart is the rate's gradient: d ln(rate) / d ln(limit), 1
// below a worker pool's knee, 0 above it, between the two and falling for a shared CPU.
//
// The controller measures it the way BBR probes for bandwidth: it runs in phases, each one
// settling for a round trip (the in-flight count follows the new capacity) and then counting
// completions for a window (and at least four round trips). A cycle is four phases: the
// capacity at 1.25 × the limit, at 0.8 × it, then twice at the limit. The up and down phases
// are adjacent, so an upstream that changes slowly moves both alike and cancels out of their
// ratio. The gradient g between them moves the limit by exp(clamp(2 (g − θ), ±0.2)), with
// θ = gradientFloor: the limit rises while 10% more concurrency buys at least 1% more
// throughput, and falls otherwise. Against a worker pool it settles where the down phase
// sits at the knee (about 1.2 × the pool's workers); against a shared CPU it goes on up to
// MaxInFlight while the rate keeps growing.
//
// Before the first cycle a startup doubles the limit per phase from InitialLimit while each
// doubling pays (the gradient over it is at least θ), as TCP's and BBR's start-ups do: a job
// that lasts half a second cannot wait for the cycles' 10-20% steps. The doubling that did not
// pay is undone.
//
// A phase whose peak in-flight count stayed below its capacity measured the application's
// demand, not the upstream, and moves nothing. Overload signals (timeouts, 429, 503) in 5% of
// a phase's samples cut the limit to 0.7 × at once; a window's mean latency above a
// configured TargetLatency lowers it by the largest step. The other controllers' baseline
// probe runs once, at the start: its latency is BaselineRTT and sets the first phases'
// lengths; ProbeInterval does not apply.
type gradient struct {
	startup    bool
	phase      int // in a cycle: 0 up, 1 down, 2 and 3 at the limit
	cap        int // the capacity during this phase
	phaseStart time.Time
	measStart  time.Time // zero while the phase settles
	measN      int
	rtt        time.Duration // the mean latency of the last measured phase: sets the phases' lengths

	// the previous measured phase, to compare with
	prevX   float64 // its completions per second
	prevCap int
	prevOK  bool // it was measured and not application-limited
}

const (
	gradientFloor = 0.1  // θ: the least gradient that justifies more concurrency
	gradientGain  = 2    // log-limit moved per unit of gradient above or below θ, per cycle
	gradientStep  = 0.2  // the largest move per cycle, in log-limit
	gradientUp    = 1.25 // the up phase's capacity, × the limit; the down phase's is its inverse
	gradientCut   = 0.7  // the limit after an overloaded phase, × the limit
)

func (g *gradient) init(l *limiter) {
	g.startup = true
	g.rtt = l.target
	if !l.probing {
		g.resume(l, time.Now())
	}
}

// resume starts a phase afresh: after a baseline probe, or at the start.
func (g *gradient) resume(l *limiter, now time.Time) {
	if g.rtt == 0 {
		g.rtt = l.baseline
	}
	g.prevOK = false
	if !g.startup {
		g.phase = 0
	}
	g.begin(l, now)
}

// begin starts the current phase: its capacity, then its settling.
func (g *gradient) begin(l *limiter, now time.Time) {
	c := l.limit
	switch {
	case g.startup:
	case g.phase == 0:
		c = max(c*gradientUp, c+1)
	case g.phase == 1:
		c = min(c/gradientUp, c-1)
	}
	g.cap = int(min(max(c, l.minLimit), l.maxLimit))
	g.phaseStart, g.measStart, g.measN = now, time.Time{}, 0
	l.winN, l.winSum, l.winOverload = 0, 0, 0
}

// observeGradient is observeLocked for the gradient controller (l.mu held, not probing).
func (l *limiter) observeGradient(s sample, now time.Time) {
	g := &l.grad
	if g.measStart.IsZero() {
		if now.Sub(g.phaseStart) < min(g.rtt, l.window) {
			return // settling: the in-flight count is still moving to this phase's capacity
		}
		g.measStart, g.measN, l.winPeak = now, 0, l.inflight
		l.winN, l.winSum, l.winOverload = 0, 0, 0
		return
	}
	g.measN++
	if s.overload {
		l.winOverload++
	}
	if !s.noRTT {
		l.winN++
		l.winSum += s.rtt
	}
	dt := now.Sub(g.measStart)
	long := max(l.window, 4*g.rtt)
	if g.startup {
		long = 8 * g.rtt // doubling: a round trip's wait would cost a busy job its start
	}
	if dt < long || (g.measN < 2*minWindowN && dt < 10*long) {
		return
	}
	x := float64(g.measN) / dt.Seconds()
	ok := l.winPeak >= g.cap // reached its capacity: the upstream's rate, not the demand
	var mean time.Duration
	if l.winN > 0 {
		mean = l.winSum / time.Duration(l.winN)
		g.rtt = mean
	}
	before := int(l.limit)
	overloaded := l.winOverload*20 >= g.measN
	tooSlow := l.target > 0 && mean > l.target
	switch {
	case overloaded:
		l.limit = max(l.minLimit, l.limit*gradientCut)
		g.startup, g.phase = false, 2 // hold at the new limit for two phases before probing
	case g.startup:
		switch {
		case tooSlow:
			l.limit = max(l.minLimit, l.limit*math.Exp(-gradientStep))
			g.startup = false
		case !ok:
			g.startup = false // demand-limited: doubling again would measure nothing
		case g.prevOK && g.prevCap < g.cap && math.Log(x/g.prevX)/math.Log(float64(g.cap)/float64(g.prevCap)) < gradientFloor:
			l.limit = float64(g.prevCap) // that doubling did not pay: undo it
			g.startup = false
		case g.cap >= int(l.maxLimit):
			g.startup = false
		default:
			l.limit = min(l.maxLimit, 2*l.limit)
		}
		if !g.startup {
			g.phase = 0
		}
	default:
		if g.phase == 1 && ok && g.prevOK && g.prevCap > g.cap {
			grad := math.Log(g.prevX/x) / math.Log(float64(g.prevCap)/float64(g.cap))
			step := min(max(gradientGain*(grad-gradientFloor), -gradientStep), gradientStep)
			l.limit = min(max(l.limit*math.Exp(step), l.minLimit), l.maxLimit)
		}
		if tooSlow {
			l.limit = max(l.minLimit, l.limit*math.Exp(-gradientStep))
		}
		g.phase = (g.phase + 1) % 4
	}
	g.prevX, g.prevCap, g.prevOK = x, g.cap, ok && !overloaded
	if int(l.limit) != before {
		l.changes++
	}

	// No baseline probe after the first: this controller does not steer by the baseline, and
	// a probe pins the capacity at MinLimit for a few round trips. Rising latency is no sign
	// of a slower upstream here either: against an upstream whose rate still grows, it is the
	// queue the controller chose to keep.
	g.begin(l, now)
}
