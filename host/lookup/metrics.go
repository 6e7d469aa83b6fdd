package lookup

import (
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// Metrics is a snapshot of one endpoint's counters, for export by the host. Counters are
// cumulative since the endpoint was opened, except the breaker's, which belong to the breaker
// shared by the tenant's endpoints of that name (see [Registry]).
type Metrics struct {
	Requests     uint64             // Do calls
	Attempts     uint64             // attempts sent upstream (first tries and retries)
	Retries      uint64             // attempts after the first
	Errors       [numKinds]uint64   // failed requests by ErrorKind (index KindNone unused)
	Statuses     [6]uint64          // responses by status class: [2] is 2xx, ... [5] is 5xx
	CacheHits    uint64             //
	CacheMisses  uint64             // cacheable requests not found in the cache
	SharedCalls  uint64             // requests that joined an identical in-flight call
	Latency      Histogram          // Do to done, per request, all outcomes
	Upstream     Histogram          // per attempt that reached the upstream: send to last body byte
	Breaker      gobreaker.State    // current state of the shared breaker
	Transitions  BreakerTransitions // of the shared breaker
	Limit        int                // current concurrency limit
	InFlight     int                // attempts in flight
	Queued       int                // requests waiting for a slot
	BaselineRTT  time.Duration      // latency baseline measured at low concurrency
	Setpoint     time.Duration      // latency the controller steers towards
	LimitChanges uint64             // controller updates that changed the limit
	_            [0]func()          // not comparable: may grow
}

// ErrorsOf returns the count of failed requests of kind k.
func (m *Metrics) ErrorsOf(k ErrorKind) uint64 {
	if k >= numKinds {
		return 0
	}
	return m.Errors[k]
}

// BreakerTransitions counts state changes of a breaker by the state entered.
type BreakerTransitions struct {
	ToOpen, ToHalfOpen, ToClosed uint64
}

// Histogram is a log-linear latency histogram: four buckets per power of two from 1µs, so a
// quantile read from it overestimates by at most 25%.
type Histogram struct {
	Counts [histBuckets]uint64 // Counts[i] counts samples in [Bucket(i))
	Count  uint64
	Sum    time.Duration
}

const (
	histSub     = 4  // buckets per octave (2 bits)
	histOctaves = 28 // 1µs .. ~2^28µs ≈ 4.5 min; larger samples go to the last bucket
	histBuckets = histOctaves * histSub
)

// Bucket returns the bounds [low, high) of Counts[i]; the last bucket also holds everything
// larger.
func (Histogram) Bucket(i int) (low, high time.Duration) {
	return bucketLow(i), bucketLow(i + 1)
}

func bucketLow(i int) time.Duration {
	if i < histSub {
		return time.Duration(i) * time.Microsecond
	}
	oct, sub := i/histSub+1, i%histSub
	return time.Duration((histSub+sub)<<(oct-2)) * time.Microsecond
}

func bucketOf(d time.Duration) int {
	v := uint64(max(d, 0) / time.Microsecond)
	if v < histSub {
		return int(v)
	}
	oct := bits.Len64(v) - 1 // v in [2^oct, 2^(oct+1)), oct >= 2
	sub := int((v >> (oct - 2)) & (histSub - 1))
	return min((oct-1)*histSub+sub, histBuckets-1)
}

// Quantile returns an upper estimate of the q-quantile (0 < q ≤ 1): the upper bound of the
// bucket holding it.
func (h Histogram) Quantile(q float64) time.Duration {
	if h.Count == 0 {
		return 0
	}
	rank := uint64(q*float64(h.Count) + 0.5)
	rank = max(1, min(rank, h.Count))
	var seen uint64
	for i, c := range h.Counts {
		seen += c
		if seen >= rank {
			if i+1 < histBuckets {
				return bucketLow(i + 1)
			}
			return bucketLow(i)
		}
	}
	return bucketLow(histBuckets - 1)
}

// Mean returns the mean sample.
func (h Histogram) Mean() time.Duration {
	if h.Count == 0 {
		return 0
	}
	return h.Sum / time.Duration(h.Count)
}

// histogram is the concurrent recorder behind Histogram.
type histogram struct {
	counts [histBuckets]atomic.Uint64
	count  atomic.Uint64
	sum    atomic.Int64
}

func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(d)].Add(1)
	h.count.Add(1)
	h.sum.Add(int64(d))
}

func (h *histogram) snapshot() (s Histogram) {
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
		s.Count += s.Counts[i]
	}
	s.Sum = time.Duration(h.sum.Load())
	return s
}

// counters are an endpoint's atomics.
type counters struct {
	requests, attempts, retries, cacheHits, cacheMisses, shared atomic.Uint64
	errors                                                      [numKinds]atomic.Uint64
	statuses                                                    [6]atomic.Uint64
	latency, upstream                                           histogram
}

// breakerStats counts the transitions of one shared breaker.
type breakerStats struct {
	toOpen, toHalfOpen, toClosed atomic.Uint64
}

func (b *breakerStats) onChange(_ string, _, to gobreaker.State) {
	switch to {
	case gobreaker.StateOpen:
		b.toOpen.Add(1)
	case gobreaker.StateHalfOpen:
		b.toHalfOpen.Add(1)
	case gobreaker.StateClosed:
		b.toClosed.Add(1)
	}
}
