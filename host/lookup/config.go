package lookup

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// EndpointConfig declares one named endpoint of a pipeline. It is plain data with JSON tags so
// that it can sit in a pipeline spec file or a REST request. Zero values mean "default":
// [EndpointConfig.EnsureDefaults] is the one place defaults live, and
// [EndpointConfig.Validate] checks a defaulted config. [Registry.Open] does both.
type EndpointConfig struct {
	// Name is how the pipeline refers to the endpoint (its manifest index maps to it).
	Name string `json:"name"`
	// BaseURL is the origin (http or https) plus an optional root path. The guest's "/" is
	// this root: a guest path can never leave it.
	BaseURL string `json:"base_url"`
	// Methods the guest may use. Default: GET and HEAD.
	Methods []string `json:"methods,omitempty"`
	// PathPrefix restricts guest paths (relative to the root) to this subtree, on a segment
	// boundary. Default "/".
	PathPrefix string `json:"path_prefix,omitempty"`
	// Headers are injected into every request; the guest never sees them and may not set
	// them. Values may reference secrets, expanded once when the endpoint is opened:
	// "${env:NAME}" is the environment variable NAME (which must be set), "${file:/path}" the
	// content of a file without its trailing newline; "$$" is a literal "$". References may
	// be embedded: "Bearer ${env:GEO_TOKEN}".
	Headers map[string]string `json:"headers,omitempty"`
	// Timeout bounds one attempt: connect, send, and reading the whole response. Default 5s.
	Timeout Duration `json:"timeout,omitempty"`
	// MaxInFlight caps concurrent attempts; the adaptive limit moves below it. Default 256.
	MaxInFlight int `json:"max_in_flight,omitempty"`
	// MaxQueued bounds requests waiting for a concurrency slot; past it a request fails
	// with KindUnavailable. Default 4 × MaxInFlight.
	MaxQueued int `json:"max_queued,omitempty"`
	// QueueTimeout bounds the wait for a slot; past it the request fails with KindTimeout.
	// Default: Timeout.
	QueueTimeout Duration `json:"queue_timeout,omitempty"`
	// MaxResponseBytes caps a response body; larger ones fail with KindTooLarge. Default
	// 16 MiB (docs/abi.md, Limits).
	MaxResponseBytes int64 `json:"max_response_bytes,omitempty"`
	// MaxRedirects is how many same-origin redirects to follow (the target must stay under
	// the prefix). A redirect to any other origin is refused whatever this says. With 0 a
	// same-origin 3xx is returned to the guest as a response.
	MaxRedirects int `json:"max_redirects,omitempty"`
	// SingleFlight: "safe" (default) shares one upstream call among concurrent identical GET
	// and HEAD requests; "all" does so for every method; "off" never.
	SingleFlight string `json:"single_flight,omitempty"`
	// Transport is the HTTP client implementation for http:// base URLs: "h1" (default), a
	// lean HTTP/1.1 client that runs each exchange on one goroutine over pooled keep-alive
	// connections (internal/h1), and reads whatever net/http's http.ReadResponse reads;
	// "h2c", HTTP/2 over cleartext with prior knowledge (the upstream must speak it): the
	// requests in flight share a few multiplexed connections, so at high concurrency the
	// client and the upstream make a fraction of the system calls (internal/h2); or "std",
	// net/http's Transport. All dial through the egress guard. "h1" and "h2c" hand
	// what they do not implement (Expect, bodies of unknown length) to net/http before
	// sending anything (over h2c for "h2c"); https endpoints always use net/http, which
	// negotiates HTTP/2 by ALPN.
	Transport string `json:"transport,omitempty"`

	Retry       RetryPolicy       `json:"retry"`
	Breaker     BreakerConfig     `json:"breaker"`
	Cache       *CacheConfig      `json:"cache,omitempty"` // nil: no cache
	Concurrency ConcurrencyConfig `json:"concurrency"`
	Egress      EgressPolicy      `json:"egress"`
}

// RetryPolicy says which failed attempts are sent again, and when. Retries wait on timers:
// a request waiting out its backoff holds no goroutine.
//
// Idempotence is respected: a non-idempotent request (POST, PATCH) is retried only when the
// failed attempt provably never reached the network (dial or DNS failure, a refused
// connection), unless RetryNonIdempotent is set.
type RetryPolicy struct {
	// MaxAttempts counts the first attempt: 1 disables retries. Default 3.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// Backoff before retry n (n ≥ 1) is min(MaxBackoff, InitialBackoff × Multiplier^(n-1)),
	// reduced by a random fraction of up to Jitter of itself. Defaults: 50ms, 1s, 2, 0.5.
	InitialBackoff Duration `json:"initial_backoff,omitempty"`
	MaxBackoff     Duration `json:"max_backoff,omitempty"`
	Multiplier     float64  `json:"multiplier,omitempty"`
	Jitter         *float64 `json:"jitter,omitempty"`
	// Statuses that retry, as codes ("503") or classes ("5xx"). Default 429, 502, 503, 504.
	// A Retry-After on such a response stretches the backoff, up to MaxBackoff.
	Statuses []string `json:"statuses,omitempty"`
	// On lists the error kinds that retry: "timeout", "unavailable". Default both.
	On []string `json:"on,omitempty"`
	// RetryNonIdempotent allows retrying POST and PATCH after they may have been sent.
	RetryNonIdempotent bool `json:"retry_non_idempotent,omitempty"`
}

// BreakerConfig configures the circuit breaker (github.com/sony/gobreaker/v2). One breaker is
// shared by every endpoint of a tenant with the same name, origin and breaker settings, across
// pipelines: see [Registry].
type BreakerConfig struct {
	Disabled bool `json:"disabled,omitempty"`
	// ConsecutiveFailures trips the breaker. Default 5.
	ConsecutiveFailures uint32 `json:"consecutive_failures,omitempty"`
	// FailureRatio, if set (0 < r ≤ 1), also trips the breaker when at least MinRequests
	// attempts in the current Window failed at this ratio or worse.
	FailureRatio float64 `json:"failure_ratio,omitempty"`
	// MinRequests guards FailureRatio. Default 20.
	MinRequests uint32 `json:"min_requests,omitempty"`
	// Window over which closed-state counts accumulate before they reset (rolling, in ten
	// buckets). Default 10s.
	Window Duration `json:"window,omitempty"`
	// Cooldown is how long the breaker stays open before letting probes through. Default 10s.
	Cooldown Duration `json:"cooldown,omitempty"`
	// HalfOpenProbes is how many attempts a half-open breaker lets through; that many
	// consecutive successes close it, one failure reopens it. Default 1.
	HalfOpenProbes uint32 `json:"half_open_probes,omitempty"`
	// FailureStatuses count as failures, as codes or classes. Default "5xx". Timeouts and
	// unavailability always count; refusals, cancellations and too-large bodies never do.
	FailureStatuses []string `json:"failure_statuses,omitempty"`
}

// CacheConfig enables a response cache. Only successful responses are cached, and only for
// the listed methods and statuses. The key is the whole request (method, path, guest headers,
// body), so two guests sharing an endpoint share entries.
type CacheConfig struct {
	TTL        Duration `json:"ttl"`                   // required
	MaxEntries int      `json:"max_entries,omitempty"` // default 10000
	MaxBytes   int64    `json:"max_bytes,omitempty"`   // body bytes; default 64 MiB
	// Methods whose responses are cached. Default GET, HEAD. Listing a non-safe method
	// (e.g. POST for a query API) is allowed but is the operator's promise that it is
	// read-only.
	Methods []string `json:"methods,omitempty"`
	// Statuses cached, as codes or classes. Default "2xx".
	Statuses []string `json:"statuses,omitempty"`
}

// ConcurrencyConfig configures the adaptive in-flight limit. See limiter.go for the
// controllers and DESIGN.md for measurements.
type ConcurrencyConfig struct {
	// Algorithm: "gradient" (default: steers by the delivered rate, see gradient.go), "pid"
	// or "aimd" (steer by latency against a setpoint), or "fixed" (always MaxInFlight).
	Algorithm string `json:"algorithm,omitempty"`
	// MinLimit is the floor of the limit, and the concurrency used while re-measuring the
	// baseline latency. Default 4 (or MaxInFlight if smaller).
	MinLimit int `json:"min_limit,omitempty"`
	// InitialLimit is the starting limit. Default max(MinLimit, MaxInFlight/4).
	InitialLimit int `json:"initial_limit,omitempty"`
	// TargetLatency, if set, is the latency setpoint. Otherwise the setpoint is
	// Tolerance × the baseline: the attempt latency measured at low concurrency.
	TargetLatency Duration `json:"target_latency,omitempty"`
	// Tolerance over the baseline (pid and aimd). Default 1.5.
	Tolerance float64 `json:"tolerance,omitempty"`
	// Window is the controller's sampling period. Default 100ms.
	Window Duration `json:"window,omitempty"`
	// ProbeInterval is how often pid and aimd re-measure the baseline (gradient measures it
	// once, at the start: it does not steer by it). It is also re-measured early
	// when latency stays well above the setpoint for half a second despite a lower limit, which is how
	// the controller tells a slower upstream from a queue it caused. Default 30s.
	ProbeInterval Duration `json:"probe_interval,omitempty"`
}

// EgressPolicy restricts which addresses the endpoint may connect to. It is enforced on the
// resolved IP address immediately before each dial, so DNS rebinding cannot bypass it, and on
// the base URL's host name when the endpoint is opened. Unspecified, multicast and broadcast
// addresses are always refused; environment proxies are never used.
type EgressPolicy struct {
	// AllowLoopback permits 127.0.0.0/8 and ::1. Off by default: loopback reaches the host's
	// own services.
	AllowLoopback bool `json:"allow_loopback,omitempty"`
	// AllowLinkLocal permits 169.254.0.0/16 and fe80::/10 (except metadata addresses).
	AllowLinkLocal bool `json:"allow_link_local,omitempty"`
	// AllowMetadata permits cloud instance-metadata addresses and names.
	AllowMetadata bool `json:"allow_metadata,omitempty"`
	// AllowedCIDRs, if not empty, is an allow-list: every dialled address must be inside one.
	AllowedCIDRs []string `json:"allowed_cidrs,omitempty"`
	// DeniedCIDRs are refused in addition.
	DeniedCIDRs []string `json:"denied_cidrs,omitempty"`
}

// Defaults, in one place.
const (
	defaultTimeout          = 5 * time.Second
	defaultMaxInFlight      = 256
	defaultMaxResponseBytes = 16 << 20
	defaultAttempts         = 3
	defaultInitialBackoff   = 50 * time.Millisecond
	defaultMaxBackoff       = time.Second
	defaultMultiplier       = 2
	defaultJitter           = 0.5
	defaultConsecutive      = 5
	defaultMinRequests      = 20
	defaultBreakerWindow    = 10 * time.Second
	defaultCooldown         = 10 * time.Second
	defaultCacheEntries     = 10000
	defaultCacheBytes       = 64 << 20
	defaultMinLimit         = 4
	defaultTolerance        = 1.5
	defaultWindow           = 100 * time.Millisecond
	defaultProbeInterval    = 30 * time.Second
	defaultTransport        = "h1"
)

// EnsureDefaults fills zero fields with their defaults. It is idempotent.
func (c *EndpointConfig) EnsureDefaults() {
	if c.Methods == nil {
		c.Methods = []string{http.MethodGet, http.MethodHead}
	}
	if c.PathPrefix == "" {
		c.PathPrefix = "/"
	}
	if c.Timeout == 0 {
		c.Timeout = Duration(defaultTimeout)
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = defaultMaxInFlight
	}
	if c.MaxQueued == 0 {
		c.MaxQueued = 4 * c.MaxInFlight
	}
	if c.QueueTimeout == 0 {
		c.QueueTimeout = c.Timeout
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = defaultMaxResponseBytes
	}
	if c.SingleFlight == "" {
		c.SingleFlight = "safe"
	}
	if c.Transport == "" {
		c.Transport = defaultTransport
	}
	r := &c.Retry
	if r.MaxAttempts == 0 {
		r.MaxAttempts = defaultAttempts
	}
	if r.InitialBackoff == 0 {
		r.InitialBackoff = Duration(defaultInitialBackoff)
	}
	if r.MaxBackoff == 0 {
		r.MaxBackoff = Duration(max(defaultMaxBackoff, time.Duration(r.InitialBackoff)))
	}
	if r.Multiplier == 0 {
		r.Multiplier = defaultMultiplier
	}
	if r.Jitter == nil {
		j := defaultJitter
		r.Jitter = &j
	}
	if r.Statuses == nil {
		r.Statuses = []string{"429", "502", "503", "504"}
	}
	if r.On == nil {
		r.On = []string{KindTimeout.String(), KindUnavailable.String()}
	}
	b := &c.Breaker
	if b.ConsecutiveFailures == 0 {
		b.ConsecutiveFailures = defaultConsecutive
	}
	if b.MinRequests == 0 {
		b.MinRequests = defaultMinRequests
	}
	if b.Window == 0 {
		b.Window = Duration(defaultBreakerWindow)
	}
	if b.Cooldown == 0 {
		b.Cooldown = Duration(defaultCooldown)
	}
	if b.HalfOpenProbes == 0 {
		b.HalfOpenProbes = 1
	}
	if b.FailureStatuses == nil {
		b.FailureStatuses = []string{"5xx"}
	}
	if cc := c.Cache; cc != nil {
		if cc.MaxEntries == 0 {
			cc.MaxEntries = defaultCacheEntries
		}
		if cc.MaxBytes == 0 {
			cc.MaxBytes = defaultCacheBytes
		}
		if cc.Methods == nil {
			cc.Methods = []string{http.MethodGet, http.MethodHead}
		}
		if cc.Statuses == nil {
			cc.Statuses = []string{"2xx"}
		}
	}
	k := &c.Concurrency
	if k.Algorithm == "" {
		k.Algorithm = "gradient"
	}
	if k.MinLimit == 0 {
		k.MinLimit = min(defaultMinLimit, c.MaxInFlight)
	}
	if k.InitialLimit == 0 {
		k.InitialLimit = max(k.MinLimit, c.MaxInFlight/4)
	}
	if k.Tolerance == 0 {
		k.Tolerance = defaultTolerance
	}
	if k.Window == 0 {
		k.Window = Duration(defaultWindow)
	}
	if k.ProbeInterval == 0 {
		k.ProbeInterval = Duration(defaultProbeInterval)
	}
}

// forbiddenHeaders may never come from the guest: they would let it change the framing or
// the target of the request (docs/abi.md lists the first five; the rest are hop-by-hop
// headers that net/http would misinterpret or a proxy would act on).
var forbiddenHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true, "Upgrade": true,
	"Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authorization": true, "Te": true, "Trailer": true,
}

// Validate checks a config after EnsureDefaults. It does not expand secrets (Registry.Open
// does, so that a validation error never contains a secret).
func (c *EndpointConfig) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Name == "" {
		bad("name is empty")
	}
	if _, err := c.parseBase(); err != nil {
		errs = append(errs, err)
	}
	if len(c.Methods) == 0 {
		bad("methods is empty")
	}
	for _, m := range c.Methods {
		if _, ok := internMethod([]byte(m)); !ok {
			bad("methods: unsupported method %q", m)
		}
	}
	if !isCleanPath(c.PathPrefix) {
		bad("path_prefix %q is not a clean absolute path", c.PathPrefix)
	}
	for name, v := range c.Headers {
		if name == "" || strings.IndexFunc(name, func(r rune) bool { return r > 0x7f || !isTokenChar(byte(r)) }) >= 0 {
			bad("headers: invalid name %q", name)
		}
		if forbiddenHeaders[textproto.CanonicalMIMEHeaderKey(name)] {
			bad("headers: %q cannot be injected", name)
		}
		if _, err := expandSecrets(v, func(string) (string, error) { return "", nil }); err != nil {
			bad("headers: %s: %v", name, err)
		}
	}
	if c.Timeout <= 0 || c.QueueTimeout <= 0 {
		bad("timeout and queue_timeout must be positive")
	}
	if c.MaxInFlight <= 0 || c.MaxQueued < 0 {
		bad("max_in_flight must be positive and max_queued non-negative")
	}
	if c.MaxResponseBytes <= 0 {
		bad("max_response_bytes must be positive")
	}
	if c.MaxRedirects < 0 || c.MaxRedirects > 10 {
		bad("max_redirects must be in [0, 10]")
	}
	switch c.SingleFlight {
	case "safe", "all", "off":
	default:
		bad("single_flight must be safe, all or off")
	}
	switch c.Transport {
	case "h1", "std", "h2c":
	case "loop":
		bad(`transport "loop" was removed (it lost to "h1" at every concurrency measured): use "h1" (the default) or "h2c"`)
	default:
		bad("transport must be h1, std or h2c")
	}
	r := c.Retry
	if r.MaxAttempts < 1 || r.MaxAttempts > 10 {
		bad("retry.max_attempts must be in [1, 10]")
	}
	if r.InitialBackoff <= 0 || r.MaxBackoff < r.InitialBackoff || r.Multiplier < 1 {
		bad("retry: need 0 < initial_backoff <= max_backoff and multiplier >= 1")
	}
	if j := *r.Jitter; j < 0 || j > 1 {
		bad("retry.jitter must be in [0, 1]")
	}
	if _, err := parseStatusSet(r.Statuses); err != nil {
		bad("retry.statuses: %v", err)
	}
	for _, k := range r.On {
		if k != KindTimeout.String() && k != KindUnavailable.String() {
			bad("retry.on: %q is not timeout or unavailable", k)
		}
	}
	b := c.Breaker
	if b.FailureRatio < 0 || b.FailureRatio > 1 {
		bad("breaker.failure_ratio must be in [0, 1]")
	}
	if b.Window <= 0 || b.Cooldown <= 0 {
		bad("breaker.window and breaker.cooldown must be positive")
	}
	if _, err := parseStatusSet(b.FailureStatuses); err != nil {
		bad("breaker.failure_statuses: %v", err)
	}
	if cc := c.Cache; cc != nil {
		if cc.TTL <= 0 || cc.MaxEntries <= 0 || cc.MaxBytes <= 0 {
			bad("cache: ttl, max_entries and max_bytes must be positive")
		}
		for _, m := range cc.Methods {
			if _, ok := internMethod([]byte(m)); !ok {
				bad("cache.methods: unsupported method %q", m)
			}
		}
		if _, err := parseStatusSet(cc.Statuses); err != nil {
			bad("cache.statuses: %v", err)
		}
	}
	k := c.Concurrency
	switch k.Algorithm {
	case "gradient", "pid", "aimd", "fixed":
	default:
		bad("concurrency.algorithm must be gradient, pid, aimd or fixed")
	}
	if k.MinLimit < 1 || k.MinLimit > c.MaxInFlight || k.InitialLimit < k.MinLimit || k.InitialLimit > c.MaxInFlight {
		bad("concurrency: need 1 <= min_limit <= initial_limit <= max_in_flight")
	}
	if k.Tolerance < 1 || k.Window <= 0 || k.ProbeInterval <= 0 || k.TargetLatency < 0 {
		bad("concurrency: need tolerance >= 1 and positive window and probe_interval")
	}
	if _, err := c.Egress.compile(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("endpoint %q: %w", c.Name, errors.Join(errs...))
	}
	return nil
}

// parseBase checks BaseURL and returns it with its root path cleaned ("" for "/").
func (c *EndpointConfig) parseBase() (*url.URL, error) {
	u, err := url.Parse(c.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("base_url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("base_url: scheme must be http or https")
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return nil, fmt.Errorf("base_url: need scheme://host[:port][/path], without userinfo, query or fragment")
	}
	p := strings.TrimSuffix(u.EscapedPath(), "/")
	if p != "" && !isCleanPath(p) {
		return nil, fmt.Errorf("base_url: path %q is not clean", u.EscapedPath())
	}
	if !c.Egress.AllowMetadata && isMetadataHost(u.Hostname()) {
		return nil, fmt.Errorf("base_url: %q is a metadata service (egress.allow_metadata)", u.Hostname())
	}
	if ip, err := netip.ParseAddr(u.Hostname()); err == nil {
		pol, err := c.Egress.compile()
		if err == nil {
			if err := pol.check(ip); err != nil {
				return nil, fmt.Errorf("base_url: %w", err)
			}
		}
	}
	out := *u
	out.Path, out.RawPath = "", ""
	if p != "" {
		if out.Path, err = url.PathUnescape(p); err != nil {
			return nil, fmt.Errorf("base_url: %w", err)
		}
		out.RawPath = p
	}
	return &out, nil
}

// expandSecrets expands "${env:NAME}", "${file:PATH}" and "$$" in v.
func expandSecrets(v string, lookup func(ref string) (string, error)) (string, error) {
	if !strings.Contains(v, "$") {
		return v, nil
	}
	var b strings.Builder
	for {
		i := strings.IndexByte(v, '$')
		if i < 0 {
			b.WriteString(v)
			break
		}
		b.WriteString(v[:i])
		v = v[i:]
		switch {
		case strings.HasPrefix(v, "$$"):
			b.WriteByte('$')
			v = v[2:]
		case strings.HasPrefix(v, "${"):
			end := strings.IndexByte(v, '}')
			if end < 0 {
				return "", errors.New("unterminated ${")
			}
			ref := v[2:end]
			if !strings.HasPrefix(ref, "env:") && !strings.HasPrefix(ref, "file:") || len(ref) == strings.IndexByte(ref, ':')+1 {
				return "", fmt.Errorf("reference ${%s}: want ${env:NAME} or ${file:PATH}", ref)
			}
			s, err := lookup(ref)
			if err != nil {
				return "", err
			}
			b.WriteString(s)
			v = v[end+1:]
		default:
			return "", errors.New(`lone "$": write "$$" for a literal dollar`)
		}
	}
	return b.String(), nil
}

// resolveSecret reads an "env:" or "file:" reference. Its errors name the reference, never
// the value.
func resolveSecret(ref string) (string, error) {
	kind, name, _ := strings.Cut(ref, ":")
	switch kind {
	case "env":
		s, ok := os.LookupEnv(name)
		if !ok {
			return "", fmt.Errorf("environment variable %s is not set", name)
		}
		return s, nil
	default: // "file"
		b, err := os.ReadFile(name)
		if err != nil {
			return "", fmt.Errorf("secret file: %w", err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
}

// Duration is a time.Duration that reads and writes JSON as a Go duration string ("250ms").
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"250ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// statusSet is a compiled set of HTTP statuses 100..599.
type statusSet [10]uint64

func (s *statusSet) has(code int) bool {
	return code >= 0 && code < 640 && s[code/64]&(1<<(code%64)) != 0
}

func (s *statusSet) add(code int) { s[code/64] |= 1 << (code % 64) }

// parseStatusSet compiles codes ("503") and classes ("5xx").
func parseStatusSet(specs []string) (statusSet, error) {
	var s statusSet
	for _, p := range specs {
		if len(p) == 3 && p[1:] == "xx" && p[0] >= '1' && p[0] <= '5' {
			base := int(p[0]-'0') * 100
			for c := base; c < base+100; c++ {
				s.add(c)
			}
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 100 || n > 599 {
			return s, fmt.Errorf("%q is not a status code or class like 5xx", p)
		}
		s.add(n)
	}
	return s, nil
}

func methodSet(ms []string) (set [len(methods)]bool) {
	for _, m := range ms {
		if i := slices.Index(methods[:], m); i >= 0 {
			set[i] = true
		}
	}
	return set
}

func methodIndex(m string) int { return slices.Index(methods[:], m) }
