package server

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
)

// Tokens are 32 random bytes, base64url, with a prefix that says what they are (so a leaked
// token is recognisable in a log or a scanner): clk_admin_... or clk_t_.... Only their SHA-256
// is stored: tokens carry 256 bits of entropy, so a fast hash is enough and a stolen catalog
// yields no usable token.
const (
	adminTokenPrefix  = "clk_admin_"
	tenantTokenPrefix = "clk_t_"
)

// NewToken returns a fresh random token with prefix.
func NewToken(prefix string) string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// HashToken is how a token is stored.
func HashToken(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return "sha256:" + hex.EncodeToString(h[:])
}

func sameHash(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// principal is who a request acts for.
type principal struct {
	admin  bool
	tenant string // the token's tenant; "" for the admin
}

const principalKey = "clink.principal"

func principalOf(c echo.Context) principal {
	p, _ := c.Get(principalKey).(principal)
	return p
}

// authenticate resolves the bearer token. Every route but the public ones goes through it.
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Request().Header.Get(echo.HeaderAuthorization)
		scheme, tok, ok := strings.Cut(h, " ")
		if h == "" {
			s.metrics.authFailures.WithLabelValues("missing").Inc()
			return problem(http.StatusUnauthorized, CodeUnauthenticated, "Authorization", "send Authorization: Bearer TOKEN (an admin or tenant token)")
		}
		if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
			s.metrics.authFailures.WithLabelValues("malformed").Inc()
			return problem(http.StatusUnauthorized, CodeUnauthenticated, "Authorization", "the Authorization header must be \"Bearer TOKEN\"")
		}
		hash := HashToken(strings.TrimSpace(tok))
		cat := s.ctl.Snapshot()
		if cat.AdminTokenHash != "" && sameHash(hash, cat.AdminTokenHash) {
			c.Set(principalKey, principal{admin: true})
			return next(c)
		}
		if t, ok := cat.TenantByTokenHash(hash); ok {
			c.Set(principalKey, principal{tenant: t.Name})
			if wait, limited := s.limiter.take(t.Name, t.Quotas.APIRequestsPerSec); limited {
				s.metrics.rateLimited.WithLabelValues(t.Name).Inc()
				p := problem(http.StatusTooManyRequests, CodeRateLimited, "", "tenant %q is over its API rate limit of %d requests/s; retry after the Retry-After header's seconds", t.Name, t.Quotas.APIRequestsPerSec)
				p.retryAfter = int(math.Ceil(wait.Seconds()))
				return p
			}
			return next(c)
		}
		s.metrics.authFailures.WithLabelValues("unknown").Inc()
		return problem(http.StatusUnauthorized, CodeUnauthenticated, "Authorization", "the token is not valid (revoked, mistyped, or from another server)")
	}
}

// limiter is a token bucket per tenant: rate tokens per second, a burst of one second's worth.
// Its clock is injected so tests never depend on wall time.
type limiter struct {
	now func() time.Time
	mu  sync.Mutex
	// buckets has one entry per tenant that has called the API; tenants are created by the
	// admin, so it is bounded by their number.
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newLimiter(now func() time.Time) *limiter {
	return &limiter{now: now, buckets: map[string]*bucket{}}
}

// take spends one token of tenant's bucket; when none is left it says how long until one is.
// The rate is read on every call, so a quota change applies at once.
func (l *limiter) take(tenant string, rate int) (wait time.Duration, limited bool) {
	if rate <= 0 {
		return time.Second, true
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	burst := float64(rate)
	b, ok := l.buckets[tenant]
	if !ok {
		b = &bucket{tokens: burst, last: now}
		l.buckets[tenant] = b
	}
	if el := now.Sub(b.last); el > 0 {
		b.tokens = math.Min(burst, b.tokens+el.Seconds()*float64(rate))
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return 0, false
	}
	need := (1 - b.tokens) / float64(rate)
	return time.Duration(need * float64(time.Second)), true
}

// requireAdmin refuses tenant tokens.
func requireAdmin(c echo.Context) error {
	if !principalOf(c).admin {
		return problem(http.StatusForbidden, CodeForbidden, "Authorization", "this needs the admin token; a tenant token cannot do it")
	}
	return nil
}

// tenantFor returns the tenant a tenant-scoped request acts for: the token's tenant, or, for
// the admin, the ?tenant= parameter.
func (s *Server) tenantFor(c echo.Context) (string, error) {
	p := principalOf(c)
	q := c.QueryParam("tenant")
	if p.admin {
		if q == "" {
			return "", badField("tenant", "the admin token acts for no tenant: add ?tenant=NAME")
		}
		if _, ok := s.ctl.Snapshot().Tenants[q]; !ok {
			return "", notFound("tenant", q)
		}
		return q, nil
	}
	if q != "" && q != p.tenant {
		return "", problem(http.StatusForbidden, CodeForbidden, "tenant", "a tenant token acts only for its own tenant")
	}
	return p.tenant, nil
}
