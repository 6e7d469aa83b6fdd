package lookup

import (
	"encoding/json"
	"math/bits"
	"strconv"
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
	Refused      [numRules]uint64   // refused requests by rule: see RefusedBy
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
	BaselineRTT  time.Duration      // latency baseline measured at low concurrency (gradient: once, at the start)
	Setpoint     time.Duration      // latency the controller steers towards (gradient: TargetLatency, its ceiling)
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

// RefusedBy returns the count of requests refused by rule (one of the Rule… constants).
func (m *Metrics) RefusedBy(rule string) uint64 {
	if i := ruleIndex(rule); i >= 0 {
		return m.Refused[i]
	}
	return 0
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
	refused                                                     [numRules]atomic.Uint64
	refusedLogged                                               [numRules]atomic.Int64 // unix ns of the last log line per rule
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

// MarshalJSON writes the snapshot with labelled counters, as `clink-wasm run --stats` prints
// it: responses by status class, failures by kind (the names of [ErrorKind.String]),
// refusals by rule (the Rule… constants), latency summaries in microseconds. Every label is
// from a fixed set, so the cardinality is bounded whatever the guest sends.
func (m Metrics) MarshalJSON() ([]byte, error) {
	type summary struct {
		Count  uint64  `json:"count"`
		MeanUS float64 `json:"mean_us"`
		P50US  float64 `json:"p50_us"`
		P99US  float64 `json:"p99_us"`
	}
	sum := func(h Histogram) summary {
		us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
		return summary{Count: h.Count, MeanUS: us(h.Mean()), P50US: us(h.Quantile(0.5)), P99US: us(h.Quantile(0.99))}
	}
	responses := make(map[string]uint64, 5)
	for cl := 1; cl < len(m.Statuses); cl++ {
		responses[strconv.Itoa(cl)+"xx"] = m.Statuses[cl]
	}
	errs := make(map[string]uint64, numKinds-1)
	for k := KindNone + 1; k < numKinds; k++ {
		errs[k.String()] = m.Errors[k]
	}
	refused := make(map[string]uint64, numRules)
	for i, r := range rules {
		refused[r] = m.Refused[i]
	}
	return json.Marshal(struct {
		Requests    uint64            `json:"requests"`
		Attempts    uint64            `json:"attempts"`
		Retries     uint64            `json:"retries"`
		Responses   map[string]uint64 `json:"responses_by_class"`
		Errors      map[string]uint64 `json:"errors_by_kind"`
		Refused     map[string]uint64 `json:"refused_by_rule"`
		CacheHits   uint64            `json:"cache_hits"`
		CacheMisses uint64            `json:"cache_misses"`
		SharedCalls uint64            `json:"shared_calls"`
		Latency     summary           `json:"latency"`
		Upstream    summary           `json:"upstream_latency"`
		Breaker     string            `json:"breaker_state"`
		Transitions map[string]uint64 `json:"breaker_transitions_to"`
		Limit       int               `json:"limit"`
		InFlight    int               `json:"in_flight"`
		Queued      int               `json:"queued"`
		BaselineUS  float64           `json:"baseline_rtt_us"`
		SetpointUS  float64           `json:"setpoint_us"`
		Changes     uint64            `json:"limit_changes"`
	}{
		m.Requests, m.Attempts, m.Retries, responses, errs, refused,
		m.CacheHits, m.CacheMisses, m.SharedCalls, sum(m.Latency), sum(m.Upstream),
		m.Breaker.String(),
		map[string]uint64{"open": m.Transitions.ToOpen, "half_open": m.Transitions.ToHalfOpen, "closed": m.Transitions.ToClosed},
		m.Limit, m.InFlight, m.Queued,
		float64(m.BaselineRTT) / float64(time.Microsecond), float64(m.Setpoint) / float64(time.Microsecond), m.LimitChanges,
	})
}
