package scheduler

import (
	"sync/atomic"
	"time"
)

// metrics are the controller's counters and gauges. Fields are atomics so any goroutine may
// read them (Controller.Metrics) while the controller runs; the runner updates cold-path
// counters directly and publishes hot-path counts (records, hits) in bulk, so the all-hits
// path pays no atomic per record.
type metrics struct {
	Records       atomic.Int64 // records completed
	Timers        atomic.Int64 // timers fired and completed
	InFlight      atomic.Int64 // tasks holding an instance (running or suspended), gauge
	Parked        atomic.Int64 // tasks waiting behind a busy key, gauge
	CapWaiting    atomic.Int64 // tasks waiting for room under the in-flight cap, gauge
	WaitingBytes  atomic.Int64 // what parked and cap-waiting tasks hold (their input), gauge
	CapWaits      atomic.Int64 // tasks that waited for room under the cap
	Admitted      atomic.Int64 // tasks admitted and not complete (the cap bounds those not parked), gauge
	Suspended     atomic.Int64 // tasks suspended in an async import, gauge
	Instances     atomic.Int64 // live instances, gauge
	PeakInstances atomic.Int64 // most instances alive at once
	Spares        atomic.Int64 // instances made off the runner (spares.go)
	InstanceWaits atomic.Int64 // tasks that waited, without an instance, for one to free (the instance budget)

	Suspensions    atomic.Int64 // total suspensions
	PrefetchWaits  atomic.Int64 // tasks that waited, without an instance, for prefetched values
	CoroutineCalls atomic.Int64 // guest calls run inside their instance's coroutine
	StateHits      atomic.Int64
	StateMisses    atomic.Int64
	Lookups        atomic.Int64
	RecordFailures atomic.Int64 // faulted records taken by OnRecordFailure (dead letters)
	RecordRetries  atomic.Int64 // faulted calls run again (WithRecordRetries)

	GateWaits     atomic.Int64 // records that parked behind a busy key
	GateWaitNanos atomic.Int64 // total time parked

	Resumes            atomic.Int64
	ResumeLatencyNanos atomic.Int64 // total time from completion posted to call resumed

	ReadBatches   atomic.Int64 // batched remote reads issued
	ReadBatchKeys atomic.Int64 // keys in them
	MaxReadBatch  atomic.Int64

	Watermarks atomic.Int64 // watermarks forwarded
	Barriers   atomic.Int64 // barriers completed

	// Where a checkpoint's time goes on the runner: from the barrier's arrival until every
	// admitted task has finished, or with barrier capture until the calls in progress have (the
	// drain), then the capture: the records not started encoded as the checkpoint's input
	// (capture.go), the timers, and the capture hook (OnBarrier: the backend's Capture, which
	// may wait for older snapshots to persist when they pin too much).
	BarrierDrainNanos   atomic.Int64
	BarrierCaptureNanos atomic.Int64
	// Records a barrier captured as checkpoint input instead of draining them (capture.go),
	// their encoded bytes, the most one barrier captured, and barriers that had to drain
	// instead (the capture found a task it could not account for).
	CapturedRecords   atomic.Int64
	CapturedBytes     atomic.Int64
	MaxCaptured       atomic.Int64
	CaptureFallbacks  atomic.Int64
	ReplayedRecords   atomic.Int64 // records of a restored checkpoint's captured input replayed
	CaptureInputNanos atomic.Int64 // of BarrierCaptureNanos, the captured input's encoding

	// The runner's time blocked waiting for something to do, and the part of it with input
	// at hand that it could not admit (the in-flight cap and the waiting records' bound).
	IdleNanos     atomic.Int64
	IdleFullNanos atomic.Int64
}

// Snapshot is a point-in-time copy of a controller's metrics (Controller.Metrics).
type Snapshot struct {
	Records, Timers                          int64
	InFlight, Parked, Suspended, Instances   int64
	CapWaiting, WaitingBytes, CapWaits       int64
	Admitted                                 int64
	PeakInstances, InstanceWaits             int64
	Spares                                   int64 // instances made off the runner
	Suspensions, StateHits, StateMisses      int64
	PrefetchWaits, CoroutineCalls            int64
	Lookups                                  int64
	RecordFailures                           int64
	RecordRetries                            int64
	GateWaits                                int64
	GateWait                                 time.Duration // mean
	Resumes                                  int64
	ResumeLatency                            time.Duration // mean
	ReadBatches, ReadBatchKeys, MaxReadBatch int64
	MeanReadBatch                            float64
	Watermarks, Barriers                     int64
	BarrierDrain, BarrierCapture             time.Duration // totals on the runner
	CapturedRecords, CapturedBytes           int64         // barriers' captured input (capture.go)
	MaxCaptured, CaptureFallbacks            int64
	ReplayedRecords                          int64
	CaptureInput                             time.Duration // total, on the runner
	Idle, IdleFull                           time.Duration // totals on the runner (see metrics)
}

// snapshot copies the metrics.
func (m *metrics) snapshot() Snapshot {
	s := Snapshot{
		Records: m.Records.Load(), Timers: m.Timers.Load(),
		InFlight: m.InFlight.Load(), Parked: m.Parked.Load(), CapWaiting: m.CapWaiting.Load(), WaitingBytes: m.WaitingBytes.Load(), CapWaits: m.CapWaits.Load(), Admitted: m.Admitted.Load(), Suspended: m.Suspended.Load(),
		Instances: m.Instances.Load(), PeakInstances: m.PeakInstances.Load(), InstanceWaits: m.InstanceWaits.Load(), Spares: m.Spares.Load(), Suspensions: m.Suspensions.Load(), PrefetchWaits: m.PrefetchWaits.Load(), CoroutineCalls: m.CoroutineCalls.Load(),
		StateHits: m.StateHits.Load(), StateMisses: m.StateMisses.Load(), Lookups: m.Lookups.Load(), RecordFailures: m.RecordFailures.Load(), RecordRetries: m.RecordRetries.Load(),
		GateWaits: m.GateWaits.Load(), Resumes: m.Resumes.Load(),
		ReadBatches: m.ReadBatches.Load(), ReadBatchKeys: m.ReadBatchKeys.Load(), MaxReadBatch: m.MaxReadBatch.Load(),
		Watermarks: m.Watermarks.Load(), Barriers: m.Barriers.Load(),
		BarrierDrain:    time.Duration(m.BarrierDrainNanos.Load()),
		BarrierCapture:  time.Duration(m.BarrierCaptureNanos.Load()),
		CapturedRecords: m.CapturedRecords.Load(), CapturedBytes: m.CapturedBytes.Load(),
		MaxCaptured: m.MaxCaptured.Load(), CaptureFallbacks: m.CaptureFallbacks.Load(),
		ReplayedRecords: m.ReplayedRecords.Load(), CaptureInput: time.Duration(m.CaptureInputNanos.Load()),
		Idle:     time.Duration(m.IdleNanos.Load()),
		IdleFull: time.Duration(m.IdleFullNanos.Load()),
	}
	if s.GateWaits > 0 {
		s.GateWait = time.Duration(m.GateWaitNanos.Load() / s.GateWaits)
	}
	if s.Resumes > 0 {
		s.ResumeLatency = time.Duration(m.ResumeLatencyNanos.Load() / s.Resumes)
	}
	if s.ReadBatches > 0 {
		s.MeanReadBatch = float64(s.ReadBatchKeys) / float64(s.ReadBatches)
	}
	return s
}

// hotCounts are runner-private counters published to Metrics in bulk: the all-hits path's
// (records, hits) and the suspension path's, so that neither pays an atomic per record. They
// reach Metrics whenever the runner waits for work and when the run ends.
type hotCounts struct {
	records, timers, hits int64
	misses, suspensions   int64
	coroCalls             int64
	resumes, resumeNanos  int64
}

func (c *Controller) publish() {
	h := &c.hot
	if h.records != 0 {
		c.metrics.Records.Add(h.records)
	}
	if h.timers != 0 {
		c.metrics.Timers.Add(h.timers)
	}
	if h.hits != 0 {
		c.metrics.StateHits.Add(h.hits)
	}
	if h.suspensions != 0 || h.misses != 0 || h.coroCalls != 0 || h.resumes != 0 {
		c.metrics.StateMisses.Add(h.misses)
		c.metrics.Suspensions.Add(h.suspensions)
		c.metrics.CoroutineCalls.Add(h.coroCalls)
		c.metrics.Resumes.Add(h.resumes)
		c.metrics.ResumeLatencyNanos.Add(h.resumeNanos)
	}
	*h = hotCounts{}
	c.metrics.InFlight.Store(int64(c.running))
	c.metrics.Parked.Store(int64(c.parked))
	c.metrics.CapWaiting.Store(int64(len(c.capWait)))
	c.metrics.WaitingBytes.Store(c.waitBytes)
	c.metrics.Admitted.Store(int64(c.admitted))
	c.metrics.Suspended.Store(int64(len(c.suspended)))
	c.metrics.Instances.Store(int64(c.instances))
}
