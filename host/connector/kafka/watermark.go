package kafka

import (
	"math"
	"time"
)

// NoWatermark is the watermark of a split that has seen no record yet: it holds the source's
// watermark back until the split sees a record or goes idle.
const NoWatermark int64 = math.MinInt64

// Watermarks tracks event-time watermarks per split with bounded out-of-orderness, and
// combines them: the source's watermark is the minimum over its active splits. A split that
// has had no record for the idle timeout stops holding the others back (Flink's
// withIdleness); when every split is idle the source is idle. Times are epoch milliseconds;
// now is passed in, so that callers (and tests) own the clock.
//
// INVARIANT: Current never returns a smaller watermark than it returned before.
type Watermarks struct {
	maxOutOfOrder int64 // ms
	idle          time.Duration
	splits        map[Split]*splitTime
	last          int64
}

type splitTime struct {
	maxTime    int64
	seen       bool
	lastActive time.Time
}

// NewWatermarks returns a tracker. idleTimeout 0 means splits never go idle.
func NewWatermarks(maxOutOfOrder, idleTimeout time.Duration) *Watermarks {
	return &Watermarks{maxOutOfOrder: maxOutOfOrder.Milliseconds(), idle: idleTimeout, splits: map[Split]*splitTime{}, last: NoWatermark}
}

// Add starts tracking s, active from now.
func (w *Watermarks) Add(s Split, now time.Time) {
	if _, ok := w.splits[s]; !ok {
		w.splits[s] = &splitTime{lastActive: now}
	}
}

// Remove stops tracking s (its partition was revoked or deleted).
func (w *Watermarks) Remove(s Split) { delete(w.splits, s) }

// Observe records an event at time ts (ms) on s.
func (w *Watermarks) Observe(s Split, ts int64, now time.Time) {
	st := w.splits[s]
	if st == nil {
		st = &splitTime{}
		w.splits[s] = st
	}
	if !st.seen || ts > st.maxTime {
		st.maxTime = ts
	}
	st.seen = true
	st.lastActive = now
}

// Split returns the watermark of s: the largest time seen minus the out-of-orderness bound,
// minus one (every record at or below it has been seen, within the bound).
func (w *Watermarks) Split(s Split) int64 {
	st := w.splits[s]
	if st == nil || !st.seen {
		return NoWatermark
	}
	return sat(st.maxTime, w.maxOutOfOrder+1)
}

func sat(t, d int64) int64 {
	if t < math.MinInt64+d {
		return math.MinInt64
	}
	return t - d
}

// Current returns the source's watermark at now and whether every split is idle. With no
// split at all the source is idle.
func (w *Watermarks) Current(now time.Time) (wm int64, idle bool) {
	minActive, maxAll := int64(math.MaxInt64), NoWatermark
	active := 0
	for s, st := range w.splits {
		swm := w.Split(s)
		maxAll = max(maxAll, swm)
		if w.idle > 0 && now.Sub(st.lastActive) >= w.idle {
			continue
		}
		active++
		minActive = min(minActive, swm)
	}
	switch {
	case active > 0:
		wm = minActive
	default:
		// All idle: the source holds nothing back; what it has seen still counts.
		wm, idle = maxAll, true
	}
	if wm < w.last {
		wm = w.last
	}
	w.last = wm
	return wm, idle
}
