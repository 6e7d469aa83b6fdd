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
// enrichment job over h2c: pid settled near 100 of 256 and delivered 0.70-0.81 of a fixed
// limit of 256). What tells them apart is the rate's gradient, d ln(rate) / d ln(limit): 1
// below a worker pool's knee, 0 above it, between the two and falling for a shared CPU.
//
// The controller measures it in phases, the way BBR probes for bandwidth: each phase settles
// for a round trip (the in-flight count follows the new capacity), then counts, for a window
// (and at least four round trips), the completions of the attempts sent in the phase (those
// sent before, at another capacity, would blur the two). It moves through three stages:
//
//   - ramp: from InitialLimit the limit grows by one per response (doubling every round trip,
//     as TCP's slow start) up to MaxInFlight, unmeasured: a job that lasts half a second
//     cannot wait for measured steps. It stops early at an overload signal, when the demand
//     does not fill the limit, or when a round trip's mean latency reaches rampLatency × the
//     lowest so far (the queue is then clearly the upstream's: no need to fill MaxInFlight).
//   - descent: a phase at the limit (after the ramp, a phase more before it: the start's
//     connections and bursts make the first one's rate the transient's), then one at f × it
//     (f = 0.8, then 0.64, then 0.5 on):
//     while the gradient between them is below θ = gradientFloor (10% less concurrency costs
//     less than 1% of the throughput), the lower limit is taken and the next step is deeper.
//     From a ramp that overshot a worker pool's knee it finds the knee in a few phases.
//   - cycle: four phases, at 1.25 × the limit, at 0.8 ×, then twice at the limit. The up and
//     down phases are adjacent, so an upstream that changes slowly moves both alike and drops
//     out of their ratio. A gradient g of θ or more in two cycles in a row moves the limit up
//     by exp(min(2 (g − θ), 0.2)), g the smaller of the two: 10% more concurrency buys at
//     least 1% more throughput; below θ in two cycles in a row the down phase's limit is
//     taken (after earlier moves down, 0.8 or 0.64 × below it). Two in a row, both ways, because on a loaded host one pair's rates move by
//     ±50%: noise alone then moves the limit neither up nor down. Against a worker pool the limit sits at
//     1.0-1.25 × the knee; against a shared CPU it goes on up to MaxInFlight while the rate
//     keeps growing, and stops where it no longer does.
//
// At MaxInFlight (where the ramp leaves an upstream whose latency did not grow 4-fold) a down
// phase waits for a hold: 1 s after the limit got there, then twice the last hold, up to 4 s,
// after each verdict to stay; until then the phase at the limit is measured again. A down phase
// there costs the rate its gradient gives up at 0.8 × (a tenth to a quarter for ~0.1 s in
// issue 11's 0.7 s enrichment job over h1), for nothing when the ceiling is right
// (holdCeiling).
//
// A phase whose peak in-flight count stayed below its capacity measured the demand, not the
// upstream, and moves nothing. Overload signals (timeouts, 429, 503) in 5% of a phase's
// samples cut the limit to 0.7 × at once; a mean latency above a configured TargetLatency
// counts as a gradient below θ. There is no baseline probe (nothing here steers by it):
// BaselineRTT is the lowest mean latency of a phase or round so far.
type gradient struct {
	stage      int // gradRamp, gradDescent, gradCycle
	phase      int // in a cycle: 0 up, 1 down, 2 and 3 at the limit; in a descent: 0 at the limit, 1 below
	depth      float64
	cap        int // the capacity during this phase
	phaseStart time.Time
	measStart  time.Time // zero while the phase settles
	measN      int
	seq        uint64        // the phase's number: an attempt sent in it carries it (call.epoch)
	rtt        time.Duration // the mean latency of the last phase or ramp round: sets the phases' lengths
	minRTT     time.Duration

	// the ramp's current round: it ends after as many completions as the limit at its start
	roundN, roundLen int
	roundSum         time.Duration
	roundStart       time.Time

	warmup   bool    // this phase follows the ramp: its measure is the start's transient, not the limit's
	low      int     // cycles in a row whose gradient was below θ
	high     int     // cycles in a row whose gradient was θ or more
	highGrad float64 // the first of those cycles' gradient
	downs    int     // moves down in a row: the next one goes 0.8^downs × below the down phase

	// At MaxInFlight no down phase starts before holdUntil (see holdCeiling).
	holdUntil time.Time
	holdFor   time.Duration // the next hold: ceilingHold, doubled per verdict to stay, up to ceilingHoldMax

	// the previous measured phase, to compare with
	prevX   float64 // its completions per second
	prevCap int
	prevOK  bool // it was measured and not application-limited
}

const (
	gradRamp = iota
	gradDescent
	gradCycle
)

const (
	gradientFloor = 0.1  // θ: the least gradient that justifies more concurrency
	gradientGain  = 2    // log-limit moved per unit of gradient above θ, per cycle
	gradientStep  = 0.2  // the largest rise per cycle, in log-limit
	gradientUp    = 1.25 // the cycle's up phase, × the limit; the down phase is its inverse
	gradientCut   = 0.7  // the limit after an overloaded phase, × the limit
	rampLatency   = 4    // a ramp stops when a round trip's latency reaches this × the lowest

	ceilingHold    = time.Second     // at MaxInFlight: the first hold before a down phase
	ceilingHoldMax = 4 * time.Second // the longest, after verdicts to stay there
)

func (g *gradient) init(l *limiter, now time.Time) {
	g.stage = gradRamp
	g.cap = int(l.limit)
	g.roundStart, g.roundLen = now, int(l.limit)
}

// enter starts stage st at the limit.
func (g *gradient) enter(l *limiter, st int, now time.Time) {
	g.stage, g.phase, g.depth, g.prevOK = st, 0, 1/gradientUp, false
	g.begin(l, now)
}

// begin starts the current phase: its capacity, then its settling.
func (g *gradient) begin(l *limiter, now time.Time) {
	c := l.limit
	switch {
	case g.stage == gradDescent && g.phase == 1:
		c = min(c*g.depth, c-1)
	case g.stage == gradCycle && g.phase == 0:
		c = max(c*gradientUp, c+1)
	case g.stage == gradCycle && g.phase == 1:
		c = math.Ceil(min(c/gradientUp, c-1)) // at a pool's knee of 8, 7 costs 1/8 where 6 would cost 1/4
	}
	g.cap = int(min(max(c, l.minLimit), l.maxLimit))
	g.phaseStart, g.measStart, g.measN = now, time.Time{}, 0
	g.seq++
	l.winN, l.winSum, l.winOverload = 0, 0, 0
}

func (g *gradient) sawRTT(l *limiter, d time.Duration) {
	g.rtt = d
	if g.minRTT == 0 || d < g.minRTT {
		g.minRTT = d
		l.baseline = d
	}
}

// observeGradient is observeLocked for the gradient controller (l.mu held).
func (l *limiter) observeGradient(s sample, now time.Time) {
	g := &l.grad
	if g.stage == gradRamp {
		l.rampGradient(s, now)
		return
	}
	if g.measStart.IsZero() {
		if now.Sub(g.phaseStart) < min(g.rtt, l.window) {
			return // settling: the in-flight count is still moving to this phase's capacity
		}
		g.measStart, g.measN, l.winPeak = now, 0, l.inflight
		l.winN, l.winSum, l.winOverload = 0, 0, 0
		return
	}
	if s.epoch != g.seq {
		return // sent in an earlier phase, at another capacity: it would blur the two
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
	if dt < long || (g.measN < 2*minWindowN && dt < 10*long) {
		return
	}
	x := float64(g.measN) / dt.Seconds()
	ok := l.winPeak >= g.cap // reached its capacity: the upstream's rate, not the demand
	var mean time.Duration
	if l.winN > 0 {
		mean = l.winSum / time.Duration(l.winN)
		g.sawRTT(l, mean)
	}
	before := int(l.limit)
	tooSlow := l.target > 0 && mean > l.target
	// grad is the gradient between the previous phase and this one, if both measured the
	// upstream and their capacities differ.
	grad, have := 0.0, false
	if ok && g.prevOK && g.prevCap != g.cap {
		grad = math.Log(g.prevX/x) / math.Log(float64(g.prevCap)/float64(g.cap))
		have = true
	}
	next := g.phase + 1
	probed := g.phase == 1 // a down phase
	switch {
	case g.warmup:
		g.warmup, next, ok = false, g.phase, false // measure this phase again
	case l.winOverload*20 >= g.measN:
		l.limit = max(l.minLimit, l.limit*gradientCut)
		g.enter(l, gradCycle, now)
		g.phase = 2 // hold at the new limit for two phases before probing again
		next = 2
	case g.stage == gradDescent && g.phase == 1:
		if (have && grad < gradientFloor) || tooSlow {
			// The lower limit costs (almost) nothing: take it, and look deeper from there.
			l.limit = max(l.minLimit, float64(g.cap))
			g.depth = max(g.depth*g.depth, 0.5)
			if g.cap > int(l.minLimit) {
				next = 1 // this phase is the next comparison's upper one
				break
			}
		}
		g.stage, next = gradCycle, 2 // done: cruise at the limit, then cycle
	case g.stage == gradCycle && g.phase == 1:
		// Either way only twice in a row: a loaded host moves one phase's rate by ±50%, and
		// one pair's verdict is as often noise as not. Both ways, so that noise alone moves the
		// limit neither up nor down.
		switch {
		case (have && grad < gradientFloor) || tooSlow:
			g.high = 0
			if g.low++; g.low < 2 && !tooSlow {
				break
			}
			// The down phase cost (almost) nothing, twice: take it, and when the last moves
			// were down too, 0.8 or 0.64 × below it, so that a limit far above a pool's knee
			// comes down in a few moves. (Not a descent from here: near the knee a descent's
			// deeper phases cost a fifth of the throughput each.)
			g.low = 0
			l.limit = max(l.minLimit, float64(g.cap))
			if g.downs > 0 {
				l.limit = max(l.minLimit, min(l.limit, l.limit*math.Pow(1/gradientUp, float64(g.downs))))
			}
			g.downs = min(g.downs+1, 2)
		case have:
			g.low = 0
			if g.high++; g.high < 2 {
				g.highGrad = grad
				break
			}
			g.high, g.downs = 0, 0
			up := gradientGain * (min(grad, g.highGrad) - gradientFloor)
			l.limit = min(l.maxLimit, l.limit*math.Exp(min(up, gradientStep)))
		}
	}
	g.prevX, g.prevCap, g.prevOK = x, g.cap, ok && l.winOverload*20 < g.measN
	if int(l.limit) != before {
		l.changes++
	}
	switch {
	case l.limit < l.maxLimit:
		g.holdFor = 0 // off the ceiling: the next arrival there starts with the first hold
	case before < int(l.maxLimit) || (probed && g.low == 0):
		// Arrived at the ceiling, or a down phase's verdict was to stay there (not a first
		// verdict to leave it, which the next cycle confirms or not).
		g.holdCeiling(now)
	}
	next %= 4
	if next == 1 && l.limit >= l.maxLimit && now.Before(g.holdUntil) {
		// Held at the ceiling: measure at the limit again instead of probing below it (in
		// a cycle, phase 0 is at the limit there: it cannot go higher).
		next = 0
	}
	g.phase = next
	g.begin(l, now)
}

// holdCeiling defers the next down phase while the limit is at MaxInFlight: by ceilingHold
// after the limit got there, and by twice the last hold (up to ceilingHoldMax) after each
// down phase whose verdict was to stay. A down phase costs its ~0.1 s the rate that its
// gradient gives up at 0.8 × (10-25% for issue 11's enrichment job over h1, which lasts
// 0.7 s); when a limit at the ceiling is right, each one is that cost for nothing, and the
// ceiling is where the ramp leaves an upstream whose latency did not grow 4-fold, so no
// queue is clearly its. A limit that should come down waits at most ceilingHoldMax for its
// next verdict; overload signals still cut it at once.
func (g *gradient) holdCeiling(now time.Time) {
	g.holdFor = min(max(2*g.holdFor, ceilingHold), ceilingHoldMax)
	g.holdUntil = now.Add(g.holdFor)
}

// rampGradient is the ramp: one more per response while the demand fills half the limit.
func (l *limiter) rampGradient(s sample, now time.Time) {
	g := &l.grad
	if s.overload {
		l.limit = max(l.minLimit, l.limit*gradientCut)
		l.changes++
		g.enter(l, gradCycle, now)
		g.phase = 2
		g.begin(l, now)
		return
	}
	if !s.noRTT {
		g.roundN++
		g.roundSum += s.rtt
	}
	if g.roundN >= g.roundLen && g.roundN > 0 {
		mean := g.roundSum / time.Duration(g.roundN)
		g.sawRTT(l, mean)
		g.roundN, g.roundSum, g.roundLen, g.roundStart = 0, 0, int(l.limit), now
		if mean >= rampLatency*g.minRTT || (l.target > 0 && mean > l.target) {
			g.enter(l, gradDescent, now)
			g.warmup = true
			return
		}
	}
	if float64(l.inflight+1) >= l.limit/2 {
		if int(l.limit) < int(l.maxLimit) {
			l.limit = min(l.maxLimit, l.limit+1)
			g.cap = int(l.limit)
			l.changes++
			g.roundStart = now
		}
		if l.limit >= l.maxLimit {
			g.enter(l, gradDescent, now)
			g.warmup = true
			g.holdFor = 0
			g.holdCeiling(now)
		}
		return
	}
	if now.Sub(g.roundStart) > l.window {
		g.enter(l, gradCycle, now) // the demand stopped filling the limit: no ramp to finish
	}
}
