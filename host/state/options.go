package state

import (
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/clink-wasm/clink-wasm/internal/objstore"
)

// Option configures a Store. Options given to Open override the same setting in the URL query.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// config holds every Store setting. Defaults live in defaultConfig and nowhere else; validate
// rejects what cannot work.
type config struct {
	hotBytes          int64         // global hot-tier budget, shared by all backends
	numKeyGroups      int           // default for operators that do not set one
	blockSize         int           // target uncompressed block size in a segment
	segmentBytes      int           // target segment size; a delta is cut into segments of about this size
	bloomBitsPerKey   int           // bloom filter bits per key
	maxSegments       int           // a lineage with more live segments than this is compacted
	retainCheckpoints int           // complete checkpoints kept (savepoints are kept regardless)
	retention         time.Duration // unreferenced objects younger than this are never deleted
	gcInterval        time.Duration // how often the garbage collector runs at most
	ioConcurrency     int           // concurrent remote requests per Store
	prefetchIndexes   bool          // after a restore, load segment indexes in the background
	rebalanceInterval time.Duration // how often the global budget is re-shared
	logger            *slog.Logger  // background failures (compaction, GC); never nil

	// file://
	fsync        bool
	maxOpenFiles int
	useUring     bool

	// s3://: the pool's own options; MaxConns is unsetByPool until poolDefaults.
	s3 objstore.S3Options
}

func defaultConfig() config {
	return config{
		hotBytes:          256 << 20,
		numKeyGroups:      DefaultKeyGroups,
		blockSize:         16 << 10,
		segmentBytes:      32 << 20,
		bloomBitsPerKey:   16,
		maxSegments:       8,
		retainCheckpoints: 3,
		retention:         time.Hour,
		gcInterval:        time.Minute,
		ioConcurrency:     unsetByPool,
		prefetchIndexes:   true,
		rebalanceInterval: 200 * time.Millisecond,
		logger:            slog.New(slog.DiscardHandler),
		fsync:             true,
		maxOpenFiles:      256,
		s3: objstore.S3Options{
			MaxConns:   unsetByPool,
			Timeout:    30 * time.Second,
			Attempts:   8,
			MaxBackoff: 5 * time.Second,
		},
	}
}

// unsetByPool marks a default that depends on the pool's scheme, filled by poolDefaults once the
// URL and the options are applied. It is not a value anyone can mean, so an explicit 0 or a
// negative count still fails validate instead of being defaulted silently.
const unsetByPool = math.MinInt

// poolDefaults fills the defaults that depend on the pool. A remote pool is latency-bound: the
// cold reads it can serve per second are its concurrency over its latency, so at S3's ~20 ms
// 32 requests in flight cap the whole tier at ~1,600 GETs/s, which is what a hot tier over S3
// collapsed to (issue 10). Local pools are bounded by the disk instead.
func (c *config) poolDefaults(scheme string) {
	if c.ioConcurrency == unsetByPool {
		c.ioConcurrency = 32
		if scheme == "s3" {
			c.ioConcurrency = 256
		}
	}
	if c.s3.MaxConns == unsetByPool {
		c.s3.MaxConns = c.ioConcurrency
	}
}

func (c *config) validate() error {
	switch {
	case c.hotBytes < 0:
		return fmt.Errorf("state: hot budget must be >= 0 (0 = unbounded), got %d", c.hotBytes)
	case c.numKeyGroups < 1 || c.numKeyGroups > MaxKeyGroups:
		return fmt.Errorf("state: key groups must be in [1, %d], got %d", MaxKeyGroups, c.numKeyGroups)
	case c.blockSize < 256 || c.blockSize > 16<<20:
		return fmt.Errorf("state: block size must be in [256, 16MiB], got %d", c.blockSize)
	case c.segmentBytes < c.blockSize:
		return fmt.Errorf("state: segment size %d below block size %d", c.segmentBytes, c.blockSize)
	case c.bloomBitsPerKey < 1 || c.bloomBitsPerKey > 32:
		return fmt.Errorf("state: bloom bits per key must be in [1, 32], got %d", c.bloomBitsPerKey)
	case c.maxSegments < 2:
		return fmt.Errorf("state: max segments must be >= 2, got %d", c.maxSegments)
	case c.retainCheckpoints < 1:
		return fmt.Errorf("state: must retain at least one checkpoint, got %d", c.retainCheckpoints)
	case c.retention < 0 || c.gcInterval <= 0 || c.rebalanceInterval <= 0:
		return fmt.Errorf("state: bad retention or intervals")
	case c.ioConcurrency < 1 || c.maxOpenFiles < 1 || c.s3.MaxConns < 1 || c.s3.Attempts < 1:
		return fmt.Errorf("state: concurrency limits and attempts must be >= 1")
	case c.s3.Timeout <= 0 || c.s3.MaxBackoff <= 0:
		return fmt.Errorf("state: s3 timeout and backoff must be > 0")
	}
	return nil
}

// applyQuery reads the documented URL query options (docs/state-format.md, "Pool URLs").
func (c *config) applyQuery(q url.Values) error {
	for k, vs := range q {
		v := vs[len(vs)-1]
		var err error
		switch k {
		case "hot_bytes":
			c.hotBytes, err = parseBytes(v)
		case "key_groups":
			c.numKeyGroups, err = strconv.Atoi(v)
		case "block_size":
			var n int64
			n, err = parseBytes(v)
			c.blockSize = int(n)
		case "segment_size":
			var n int64
			n, err = parseBytes(v)
			c.segmentBytes = int(n)
		case "bloom_bits":
			c.bloomBitsPerKey, err = strconv.Atoi(v)
		case "max_segments":
			c.maxSegments, err = strconv.Atoi(v)
		case "retain":
			c.retainCheckpoints, err = strconv.Atoi(v)
		case "retention":
			c.retention, err = time.ParseDuration(v)
		case "gc_interval":
			c.gcInterval, err = time.ParseDuration(v)
		case "io_concurrency":
			c.ioConcurrency, err = strconv.Atoi(v)
		case "prefetch":
			c.prefetchIndexes, err = strconv.ParseBool(v)
		case "fsync":
			c.fsync, err = strconv.ParseBool(v)
		case "max_open_files":
			c.maxOpenFiles, err = strconv.Atoi(v)
		case "uring":
			c.useUring, err = strconv.ParseBool(v)
		case "endpoint":
			c.s3.Endpoint = v
		case "region":
			c.s3.Region = v
		case "path_style":
			c.s3.PathStyle, err = strconv.ParseBool(v)
		case "max_conns":
			c.s3.MaxConns, err = strconv.Atoi(v)
		case "timeout":
			c.s3.Timeout, err = time.ParseDuration(v)
		case "max_attempts":
			c.s3.Attempts, err = strconv.Atoi(v)
		case "max_backoff":
			c.s3.MaxBackoff, err = time.ParseDuration(v)
		default:
			return fmt.Errorf("state: unknown URL option %q", k)
		}
		if err != nil {
			return fmt.Errorf("state: URL option %s=%q: %w", k, v, err)
		}
	}
	return nil
}

// parseBytes parses "1048576", "64k", "256m" or "2g" (binary units).
func parseBytes(s string) (int64, error) {
	mult := int64(1)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'k', 'K':
			mult, s = 1<<10, s[:n-1]
		case 'm', 'M':
			mult, s = 1<<20, s[:n-1]
		case 'g', 'G':
			mult, s = 1<<30, s[:n-1]
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("bad byte size %q", s)
	}
	return v * mult, nil
}

// WithHotBytes sets the global hot-tier budget in bytes, shared fairly by every backend of the
// Store (0 = unbounded). Default 256 MiB. URL: hot_bytes=256m.
func WithHotBytes(n int64) Option { return optionFunc(func(c *config) { c.hotBytes = n }) }

// WithKeyGroups sets the default number of key groups. Default 128. URL: key_groups=128.
func WithKeyGroups(n int) Option { return optionFunc(func(c *config) { c.numKeyGroups = n }) }

// WithBlockSize sets the target block size of segments: the unit of a cold read. Default
// 16 KiB. URL: block_size=16k.
func WithBlockSize(n int) Option { return optionFunc(func(c *config) { c.blockSize = n }) }

// WithSegmentBytes sets the target segment size. Default 32 MiB. URL: segment_size=32m.
func WithSegmentBytes(n int) Option { return optionFunc(func(c *config) { c.segmentBytes = n }) }

// WithBloomBitsPerKey sets the bloom filter density. Default 16 (~0.05% false positives per
// segment). A key no segment holds is known absent without a GET only if every segment's filter
// rules it out, and a tier of spills has tens of segments: at 10 bits (~1% each) 40 segments
// sent about 25% of new keys to a read, at 16 bits 2% (issue 10). URL: bloom_bits=16.
func WithBloomBitsPerKey(n int) Option {
	return optionFunc(func(c *config) { c.bloomBitsPerKey = n })
}

// WithMaxSegments sets how many live segments a subtask may have before it is compacted.
// Default 8. URL: max_segments=8.
func WithMaxSegments(n int) Option { return optionFunc(func(c *config) { c.maxSegments = n }) }

// WithRetainCheckpoints sets how many complete checkpoints are kept. Default 3. URL: retain=3.
func WithRetainCheckpoints(n int) Option {
	return optionFunc(func(c *config) { c.retainCheckpoints = n })
}

// WithRetention sets how old an unreferenced object must be before it is deleted: it must exceed
// the longest checkpoint persist. Default 1h. URL: retention=1h.
func WithRetention(d time.Duration) Option { return optionFunc(func(c *config) { c.retention = d }) }

// WithGCInterval sets how often garbage collection runs at most. Default 1m. URL: gc_interval=1m.
func WithGCInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.gcInterval = d })
}

// WithIOConcurrency bounds concurrent remote requests of the Store. Default 256 for s3://, 32
// for file:// and mem://. URL: io_concurrency=32.
func WithIOConcurrency(n int) Option { return optionFunc(func(c *config) { c.ioConcurrency = n }) }

// WithPrefetchIndexes makes a restore load segment indexes in the background after it returns
// (they are loaded on demand regardless). Default true. URL: prefetch=true.
func WithPrefetchIndexes(on bool) Option {
	return optionFunc(func(c *config) { c.prefetchIndexes = on })
}

// WithFsync turns fsync of the file pool on or off (off is only for tests and benchmarks).
// Default true. URL: fsync=true.
func WithFsync(on bool) Option { return optionFunc(func(c *config) { c.fsync = on }) }

// S3Options configures an s3:// pool. Each field also has a URL query option (in brackets); a
// zero field leaves the URL's value or the default in force.
type S3Options struct {
	// Endpoint is an S3-compatible server, for example "http://127.0.0.1:7070". Default: AWS.
	// [endpoint]
	Endpoint string
	// Region defaults to the standard AWS configuration chain, falling back to us-east-1.
	// [region]
	Region string
	// PathStyle selects path-style addressing (bucket in the path), which most S3-compatible
	// servers need. [path_style=true]
	PathStyle bool
	// MaxConns bounds the connection pool. Default: the IO concurrency. [max_conns]
	MaxConns int
	// Timeout bounds one attempt, including reading the body. Default 30s. [timeout]
	Timeout time.Duration
	// MaxAttempts is the attempts per request: 5xx, SlowDown, timeouts and broken connections
	// are retried with jittered exponential backoff capped at MaxBackoff. Default 8 and 5s.
	// [max_attempts, max_backoff]
	MaxAttempts int
	MaxBackoff  time.Duration
	// HTTPClient replaces the pool's HTTP client (fault injection, custom TLS); the pool still
	// applies its timeouts and retries.
	HTTPClient *http.Client
}

// WithS3 configures the s3:// pool; see S3Options.
func WithS3(o S3Options) Option {
	return optionFunc(func(c *config) {
		if o.Endpoint != "" {
			c.s3.Endpoint = o.Endpoint
		}
		if o.Region != "" {
			c.s3.Region = o.Region
		}
		if o.PathStyle {
			c.s3.PathStyle = true
		}
		if o.MaxConns != 0 {
			c.s3.MaxConns = o.MaxConns
		}
		if o.Timeout != 0 {
			c.s3.Timeout = o.Timeout
		}
		if o.MaxAttempts != 0 {
			c.s3.Attempts = o.MaxAttempts
		}
		if o.MaxBackoff != 0 {
			c.s3.MaxBackoff = o.MaxBackoff
		}
		if o.HTTPClient != nil {
			c.s3.HTTPClient = o.HTTPClient
		}
	})
}

// WithUring makes the file pool read blocks through io_uring (experimental; see host/uring).
// URL: uring=true.
func WithUring(on bool) Option { return optionFunc(func(c *config) { c.useUring = on }) }

// WithLogger sets where the Store logs what fails in the background, where no caller sees an
// error: compaction and garbage collection (both retried later). Default: discarded. A nil
// logger keeps the default.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// withTestIntervals shortens background intervals (tests).
func withIntervals(gc, rebalance time.Duration) Option {
	return optionFunc(func(c *config) { c.gcInterval, c.rebalanceInterval = gc, rebalance })
}
