package state

import (
	"sync/atomic"
	"time"
)

// Metrics is a point-in-time view of a Store or of one backend. Counters are cumulative.
type Metrics struct {
	// Hot tier.
	// HotBytes is what the hot tier holds, all counted in its budget: entries (keys + values
	// + per-entry overhead), MemSegmentBytes and IndexBytes.
	HotBytes    int64
	HotLimit    int64 // current budget (sum over backends for a Store; 0 = unbounded)
	HotOverflow int64 // bytes above the limit that only dirty or pinned entries, in-memory segments and indexes hold
	HotEntries  int64
	// MemSegmentBytes: encoded segments held in memory until durable (deltas in flight,
	// readable from there, and the carried ones of failed persists).
	MemSegmentBytes int64
	// IndexBytes: the loaded indexes and bloom filters of the live segments (about 2 bytes
	// per durable key at 16 bits per key, plus a block index).
	IndexBytes  int64
	Hits        int64   // Get answered authoritatively (including known-absent keys)
	Misses      int64   // Get answered cold: the caller must Fetch
	HitRatio    float64 // Hits / (Hits + Misses); 0 before any Get
	Evictions   int64
	Fills       int64 // fetched values installed
	FillsDenied int64 // fetched values dropped because the key was written meanwhile

	// Cold reads.
	FetchKeys   int64 // keys asked of Fetch
	FetchFound  int64 // of them, found in the durable tier (the rest cost a read for nothing)
	FetchBlocks int64 // blocks read for them (one ranged GET each)
	// FetchRetryRounds counts lookup rounds after the first: a round trip more for the keys
	// whose first candidate block a segment's filter named falsely.
	FetchRetryRounds int64
	MetaLoads        int64 // segment indexes and filters read (one ranged GET each)
	// Lookups counts the lookups run (each one round trip of parallel ranged GETs for the
	// keys of every Fetch it took), LookupKeys the keys they carried.
	Lookups, LookupKeys int64
	// Gauges of the cold path: keys asked of Fetch and not yet answered (queued or in a
	// lookup), lookups running, and the keys in them.
	FetchKeysOut, LookupsRunning, LookupKeysRunning int64

	// Remote requests to the pool: every GET (ranged block reads, metas, manifests), PUT,
	// LIST and DELETE, from cold reads, checkpoints, spills, compaction and GC. The pool is
	// the Store's: a backend's Metrics report the Store's counters, shared by its backends.
	RemoteGets, RemotePuts, RemoteLists, RemoteDeletes int64
	RemoteGetBytes, RemotePutBytes                     int64
	RemoteErrors                                       int64
	RemoteGetLatency, RemotePutLatency                 time.Duration // mean per request

	// Durable layout.
	Segments       int64 // live segments (sum over backends for a Store)
	MaxSegments    int64 // most live segments of one subtask
	CompactionDebt int64 // bytes a compaction would rewrite now
	Compactions    int64
	Corruptions    int64 // corrupt reads detected (and not served)

	// Checkpoints.
	Checkpoints            int64
	CheckpointFailures     int64
	CheckpointBytes        int64 // total bytes written by checkpoints (segments + manifests)
	LastCheckpointBytes    int64
	LastCheckpointDuration time.Duration
	CheckpointDuration     time.Duration // total

	// Spills: deltas of dirty entries written to the pool between checkpoints because they
	// reached a third of the hot budget (adopted by the next checkpoint; see Tiered.spill).
	Spills     int64
	SpillBytes int64
	// SpillMerges counts merges of spills not yet adopted by a checkpoint into one segment.
	SpillMerges int64
	// Backpressure is the time the runner waited for deltas to persist before it could spill
	// or capture another (their pinned bytes and the dirty ones would not fit the budget).
	Backpressure time.Duration
}

// backendCounters are a backend's metrics, updated with atomics so Metrics can read them from
// any goroutine while the runner and workers write them.
type backendCounters struct {
	hotBytes, hotLimit, hotOverflow, hotEntries atomic.Int64
	memSegBytes, indexBytes                     atomic.Int64
	hits, misses, evictions, fills, fillsDenied atomic.Int64
	fetchKeys, fetchFound, fetchBlocks          atomic.Int64
	fetchRounds                                 atomic.Int64
	metaLoads                                   atomic.Int64
	lookups, lookupKeys                         atomic.Int64
	fetchOut, lookupsRun, lookupKeysRun         atomic.Int64
	segments, compactionDebt, compactions       atomic.Int64
	corruptions                                 atomic.Int64
	checkpoints, ckptFailures, ckptBytes        atomic.Int64
	lastCkptBytes, lastCkptNanos, ckptNanos     atomic.Int64
	spills, spillBytes, spillMerges             atomic.Int64
	backpressureNanos                           atomic.Int64
}

func (c *backendCounters) snapshot() Metrics {
	return Metrics{
		HotBytes: c.hotBytes.Load(), HotLimit: c.hotLimit.Load(), HotOverflow: c.hotOverflow.Load(),
		HotEntries: c.hotEntries.Load(), Hits: c.hits.Load(), Misses: c.misses.Load(),
		MemSegmentBytes: c.memSegBytes.Load(), IndexBytes: c.indexBytes.Load(),
		Evictions: c.evictions.Load(), Fills: c.fills.Load(), FillsDenied: c.fillsDenied.Load(),
		FetchKeys: c.fetchKeys.Load(), FetchFound: c.fetchFound.Load(), FetchBlocks: c.fetchBlocks.Load(),
		FetchRetryRounds: c.fetchRounds.Load(),
		MetaLoads:        c.metaLoads.Load(),
		Lookups:          c.lookups.Load(), LookupKeys: c.lookupKeys.Load(),
		FetchKeysOut: c.fetchOut.Load(), LookupsRunning: c.lookupsRun.Load(), LookupKeysRunning: c.lookupKeysRun.Load(),
		Segments: c.segments.Load(), MaxSegments: c.segments.Load(),
		CompactionDebt: c.compactionDebt.Load(), Compactions: c.compactions.Load(),
		Corruptions: c.corruptions.Load(), Checkpoints: c.checkpoints.Load(),
		CheckpointFailures: c.ckptFailures.Load(), CheckpointBytes: c.ckptBytes.Load(),
		LastCheckpointBytes:    c.lastCkptBytes.Load(),
		LastCheckpointDuration: time.Duration(c.lastCkptNanos.Load()),
		CheckpointDuration:     time.Duration(c.ckptNanos.Load()),
		Spills:                 c.spills.Load(), SpillBytes: c.spillBytes.Load(), SpillMerges: c.spillMerges.Load(),
		Backpressure: time.Duration(c.backpressureNanos.Load()),
	}
}

// add folds b into m. Gauges are added only when live (retired backends keep counters only).
func (m *Metrics) add(b Metrics, live bool) {
	if live {
		m.HotBytes += b.HotBytes
		m.HotLimit += b.HotLimit
		m.HotOverflow += b.HotOverflow
		m.HotEntries += b.HotEntries
		m.MemSegmentBytes += b.MemSegmentBytes
		m.IndexBytes += b.IndexBytes
		m.Segments += b.Segments
		m.MaxSegments = max(m.MaxSegments, b.MaxSegments)
		m.CompactionDebt += b.CompactionDebt
		m.FetchKeysOut += b.FetchKeysOut
		m.LookupsRunning += b.LookupsRunning
		m.LookupKeysRunning += b.LookupKeysRunning
		if b.LastCheckpointDuration > m.LastCheckpointDuration {
			m.LastCheckpointDuration = b.LastCheckpointDuration
			m.LastCheckpointBytes = b.LastCheckpointBytes
		}
	}
	m.Hits += b.Hits
	m.Misses += b.Misses
	m.Evictions += b.Evictions
	m.Fills += b.Fills
	m.FillsDenied += b.FillsDenied
	m.FetchKeys += b.FetchKeys
	m.FetchFound += b.FetchFound
	m.FetchBlocks += b.FetchBlocks
	m.FetchRetryRounds += b.FetchRetryRounds
	m.MetaLoads += b.MetaLoads
	m.Lookups += b.Lookups
	m.LookupKeys += b.LookupKeys
	m.Compactions += b.Compactions
	m.Corruptions += b.Corruptions
	m.Checkpoints += b.Checkpoints
	m.CheckpointFailures += b.CheckpointFailures
	m.CheckpointBytes += b.CheckpointBytes
	m.CheckpointDuration += b.CheckpointDuration
	m.Spills += b.Spills
	m.SpillBytes += b.SpillBytes
	m.SpillMerges += b.SpillMerges
	m.Backpressure += b.Backpressure
}

func (r *backendCounters) add(b *backendCounters, _ bool) {
	// retired counters: keep cumulative values only
	r.hits.Add(b.hits.Load())
	r.misses.Add(b.misses.Load())
	r.evictions.Add(b.evictions.Load())
	r.fills.Add(b.fills.Load())
	r.fillsDenied.Add(b.fillsDenied.Load())
	r.fetchKeys.Add(b.fetchKeys.Load())
	r.fetchFound.Add(b.fetchFound.Load())
	r.fetchBlocks.Add(b.fetchBlocks.Load())
	r.fetchRounds.Add(b.fetchRounds.Load())
	r.metaLoads.Add(b.metaLoads.Load())
	r.lookups.Add(b.lookups.Load())
	r.lookupKeys.Add(b.lookupKeys.Load())
	r.compactions.Add(b.compactions.Load())
	r.corruptions.Add(b.corruptions.Load())
	r.checkpoints.Add(b.checkpoints.Load())
	r.ckptFailures.Add(b.ckptFailures.Load())
	r.ckptBytes.Add(b.ckptBytes.Load())
	r.ckptNanos.Add(b.ckptNanos.Load())
	r.spills.Add(b.spills.Load())
	r.spillBytes.Add(b.spillBytes.Load())
	r.spillMerges.Add(b.spillMerges.Load())
	r.backpressureNanos.Add(b.backpressureNanos.Load())
}

// Metrics returns the Store's metrics: the sum over its backends (closed ones included for
// counters) and the remote pool's request counters.
func (s *Store) Metrics() Metrics {
	var m Metrics
	s.mu.Lock()
	m.add(s.mu.retired.snapshot(), false)
	for b := range s.mu.backends {
		m.add(b.cnt.snapshot(), true)
	}
	s.mu.Unlock()
	s.remoteInto(&m)
	m.ratios()
	return m
}

func (m *Metrics) ratios() {
	if n := m.Hits + m.Misses; n > 0 {
		m.HitRatio = float64(m.Hits) / float64(n)
	}
}

// remoteInto copies the pool's request counters into m.
func (s *Store) remoteInto(m *Metrics) {
	r := s.remote
	m.RemoteGets, m.RemotePuts = r.gets.Load(), r.puts.Load()
	m.RemoteLists, m.RemoteDeletes = r.lists.Load(), r.deletes.Load()
	m.RemoteGetBytes, m.RemotePutBytes = r.getBytes.Load(), r.putBytes.Load()
	m.RemoteErrors = r.errors.Load()
	if m.RemoteGets > 0 {
		m.RemoteGetLatency = time.Duration(r.getNanos.Load() / m.RemoteGets)
	}
	if m.RemotePuts > 0 {
		m.RemotePutLatency = time.Duration(r.putNanos.Load() / m.RemotePuts)
	}
}
