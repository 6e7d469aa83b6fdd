package lookup

import (
	"math"
	"runtime/metrics"
	"sync"
	"time"
)

// schedLatency measures the client's own queueing: the mean time goroutines of this process
// spent runnable before they ran (runtime/metrics "/sched/latencies:seconds") since the last
// call. Every exchange's upstream share (from the request's write to the response head)
// contains one such wait, the reading goroutine's wake-up after the response arrived; on a
// busy client (a pipeline whose guests take the cores) it grows with the client's load, not
// the upstream's, so the controller takes it out before it compares latency with the
// setpoint. One reader per limiter; reading costs a few microseconds, once per window.
type schedLatency struct {
	mu     sync.Mutex
	sample [1]metrics.Sample
	counts []uint64 // cumulative bucket counts at the last call
}

const schedLatencyMetric = "/sched/latencies:seconds"

// readSchedMetrics reads the runtime's metrics. A test on synctest's fake clock replaces it
// (fakeClockSched): the histogram is of real time, which a loaded host fills with waits of
// milliseconds that the fake-time samples never held.
var readSchedMetrics = metrics.Read

// since returns the mean scheduling latency since the previous call (0 on the first).
func (s *schedLatency) since() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sample[0].Name = schedLatencyMetric
	readSchedMetrics(s.sample[:])
	if s.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0
	}
	h := s.sample[0].Value.Float64Histogram()
	first := s.counts == nil
	if len(s.counts) != len(h.Counts) {
		s.counts = make([]uint64, len(h.Counts))
		first = true
	}
	var n uint64
	var sum float64
	for i, c := range h.Counts {
		d := c - s.counts[i]
		s.counts[i] = c
		if d == 0 || first {
			continue
		}
		lo, hi := h.Buckets[i], h.Buckets[i+1]
		if math.IsInf(lo, -1) {
			lo = 0
		}
		if math.IsInf(hi, 1) {
			hi = lo
		}
		n += d
		sum += float64(d) * (lo + hi) / 2
	}
	if n == 0 {
		return 0
	}
	return time.Duration(sum / float64(n) * float64(time.Second))
}
