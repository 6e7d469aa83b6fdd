package lookup

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"
)

// Registry opens endpoints and owns what they share across pipelines: one circuit breaker per
// (tenant, endpoint name, origin, breaker settings). Several pipelines of a tenant that call
// the same service therefore trip and recover together, and one tenant's failures never open
// another tenant's breaker. A host process has one Registry.
type Registry struct {
	dial    DialFunc
	resolve ResolveFunc
	log     *slog.Logger

	mu       sync.Mutex
	breakers map[string]*sharedBreaker // guarded by mu
}

// Option configures a Registry (see NewRegistry). The same style as host/state and
// host/scheduler: options apply in order, defaults are filled in once by NewRegistry.
type Option interface{ apply(*Registry) }

type optionFunc func(*Registry)

func (f optionFunc) apply(r *Registry) { f(r) }

// WithDialer replaces the function that opens connections (the default is a net.Dialer). It
// is only ever called with a literal IP address that the endpoint's egress policy admitted,
// which makes it the place to plug in another transport (io_uring) or, in tests, a dialer
// that proves no connection leaves loopback.
func WithDialer(d DialFunc) Option { return optionFunc(func(r *Registry) { r.dial = d }) }

// WithResolver replaces DNS resolution (the default is net.DefaultResolver).
func WithResolver(f ResolveFunc) Option { return optionFunc(func(r *Registry) { r.resolve = f }) }

// WithLogger sets where the endpoints log (the default discards): refusals, with the rule
// that refused (at most one line per rule and endpoint a second, with the running count),
// and the shared breakers' state changes. Lines carry "tenant" and "endpoint" attributes;
// they never carry header values, bodies or query strings.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(r *Registry) { r.log = l }) }

// NewRegistry returns an empty Registry.
func NewRegistry(opts ...Option) *Registry {
	r := &Registry{breakers: make(map[string]*sharedBreaker)}
	for _, o := range opts {
		o.apply(r)
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.resolve == nil {
		r.resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	return r
}

type sharedBreaker struct {
	key   string
	refs  int // guarded by Registry.mu
	cb    *gobreaker.TwoStepCircuitBreaker[struct{}]
	stats breakerStats
}

// Open validates cfg (after filling its defaults), expands its secrets, and returns a ready
// endpoint for tenant. Close it when the pipeline stops.
func (r *Registry) Open(tenant string, cfg EndpointConfig) (*Endpoint, error) {
	cfg = cloneConfig(cfg)
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e, err := newEndpoint(tenant, &cfg, r)
	if err != nil {
		return nil, err
	}
	if !cfg.Breaker.Disabled {
		e.breaker = r.acquireBreaker(tenant, &cfg, e.base.Scheme+"://"+e.base.Host)
	}
	return e, nil
}

func (r *Registry) acquireBreaker(tenant string, cfg *EndpointConfig, origin string) *sharedBreaker {
	b := cfg.Breaker
	key := fmt.Sprintf("%s\x00%s\x00%s\x00%+v", tenant, cfg.Name, origin, b)
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb := r.breakers[key]; sb != nil {
		sb.refs++
		return sb
	}
	sb := &sharedBreaker{key: key, refs: 1}
	log := r.log.With("tenant", tenant, "endpoint", cfg.Name)
	window := time.Duration(b.Window)
	sb.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         tenant + "/" + cfg.Name,
		MaxRequests:  b.HalfOpenProbes,
		Interval:     window,
		BucketPeriod: window / 10,
		Timeout:      time.Duration(b.Cooldown),
		ReadyToTrip: func(c gobreaker.Counts) bool {
			if c.ConsecutiveFailures >= b.ConsecutiveFailures {
				return true
			}
			return b.FailureRatio > 0 && c.Requests >= b.MinRequests &&
				float64(c.TotalFailures) >= b.FailureRatio*float64(c.Requests)
		},
		OnStateChange: func(name string, from, to gobreaker.State) {
			sb.stats.onChange(name, from, to)
			log.Warn("lookup breaker state changed", "from", from.String(), "to", to.String())
		},
		IsExcluded: func(err error) bool { return err == errExcluded },
	})
	r.breakers[key] = sb
	return sb
}

func (r *Registry) releaseBreaker(sb *sharedBreaker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb.refs--; sb.refs == 0 {
		delete(r.breakers, sb.key)
	}
}

// errExcluded reports an outcome that says nothing about the upstream's health (a refusal, a
// cancellation, an expired queue wait) to the breaker, which then neither counts it nor holds
// a half-open slot for it.
var errExcluded = &Error{Kind: KindCancelled, Reason: "excluded from breaker counts"}

// errBreakerFailure is reported for a failed attempt.
var errBreakerFailure = &Error{Kind: KindUnavailable, Reason: "breaker failure"}

func cloneConfig(c EndpointConfig) EndpointConfig {
	c.Methods = append([]string(nil), c.Methods...)
	if c.Headers != nil {
		h := make(map[string]string, len(c.Headers))
		for k, v := range c.Headers {
			h[k] = v
		}
		c.Headers = h
	}
	if c.Cache != nil {
		cc := *c.Cache
		c.Cache = &cc
	}
	if c.Retry.Jitter != nil {
		j := *c.Retry.Jitter
		c.Retry.Jitter = &j
	}
	return c
}

// injectedHeaders expands the secrets of cfg.Headers.
func injectedHeaders(cfg *EndpointConfig) (http.Header, map[string]bool, error) {
	h := make(http.Header, len(cfg.Headers))
	names := make(map[string]bool, len(cfg.Headers))
	for name, v := range cfg.Headers {
		val, err := expandSecrets(v, resolveSecret)
		if err != nil {
			return nil, nil, fmt.Errorf("endpoint %q: header %s: %w", cfg.Name, name, err)
		}
		for i := 0; i < len(val); i++ {
			if c := val[i]; (c < ' ' && c != '\t') || c == 0x7f {
				return nil, nil, fmt.Errorf("endpoint %q: header %s: value has a control character", cfg.Name, name)
			}
		}
		k := textproto.CanonicalMIMEHeaderKey(name)
		h[k] = append(h[k], val)
		names[k] = true
	}
	return h, names, nil
}
