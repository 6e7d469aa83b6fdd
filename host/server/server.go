// Package server is the hosted platform's REST API (`clink-wasm serve`): authentication,
// tenants and their quotas, the module registry, pipeline records, metrics, the OpenAPI
// document and the embedded web console.
//
// Every route is declared once, in routes(): the table registers the echo handlers, generates
// /openapi.json and drives the security tests, so the three cannot drift apart.
//
// # Auth
//
// Every route except /healthz, /readyz, /openapi.json and the console's static files needs
// Authorization: Bearer TOKEN. The admin token (created on first start and shown once, or set
// by CLINK_ADMIN_TOKEN) manages tenants and may act for any tenant with ?tenant=NAME; a tenant
// token acts for its own tenant only, and another tenant's module or pipeline is "not found"
// to it, so ids do not leak across tenants. Tokens are stored as SHA-256 hashes.
//
// # Errors
//
// Every error is an RFC 9457 problem (application/problem+json) with a stable code and the
// field at fault: see Problem.
//
// # Pipelines
//
// Pipeline records are stored and validated (modules resolved, quotas checked, the spec parsed
// by pipeline.ParseSpec). With Config.DataURL set, the server runs them in process through
// pipeline.Start (runtime.go): start, stop, savepoints, durable HTTP ingest, the preview
// output, metrics, errors and checkpoints; a new Server resumes every pipeline whose record
// says it was running. Without a DataURL the run-time routes answer 501 runtime_unavailable.
package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/control"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// Defaults of `clink-wasm serve`.
const (
	DefaultListen        = "127.0.0.1:8080"
	DefaultDataDir       = ".clink/server"
	DefaultMaxModuleSize = 64 << 20
)

// Config configures a Server. The zero value of a field means its default.
type Config struct {
	// MaxModuleBytes caps a module upload for every tenant (a tenant's quota may be lower).
	MaxModuleBytes int64
	// AdminToken, when set, becomes the admin token (CLINK_ADMIN_TOKEN).
	AdminToken string
	// Logger receives structured logs; default: JSON on stderr.
	Logger *slog.Logger
	// Now is the clock for rate limits and record timestamps; default time.Now.
	Now func() time.Time
	// Console is the web console's files (web.Dist()); nil serves none.
	Console fs.FS
	// RefreshInterval is how often the catalog is re-read to see what another server process
	// on the same store committed; default 5s, negative for never.
	RefreshInterval time.Duration
	// ValidationConcurrency bounds concurrent module uploads: each holds its body in memory and
	// compiles it (CPU-heavy). Default 2.
	ValidationConcurrency int
	// DataURL is the server's data URL (--data): each pipeline's state pool is under it
	// (control.StateURL). Empty: the pipeline runtime is off and the run-time routes answer
	// 501 runtime_unavailable.
	DataURL string
	// RunDir is the local directory of the pipelines' ingest logs and preview outputs.
	// Default: run/ under a local DataURL, else .clink/run.
	RunDir string
	// MaxIngestLagBytes is how far ingest may run ahead of a pipeline before POST …/records
	// answers 429 (default 64 MiB).
	MaxIngestLagBytes int64
	// MaxIngestBytes caps one POST …/records body (default 8 MiB; more is 413).
	MaxIngestBytes int64
	// FixedCPUShares keeps the tenants' guest CPU shares at their quotas whatever the CPU the
	// host gets; by default they shrink with the pressure on the server's threads (capacity.go).
	FixedCPUShares bool
	// GuestCPUBudget is the millicores the CPU shares of the tenants running pipelines may sum
	// to (cpubudget.go): a start or a quota raise beyond it is refused with 409
	// cpu_overcommitted. Default: the host's cores (GOMAXPROCS × 1000); negative: no check.
	GuestCPUBudget int64
	// StateOptions are extra options for every pipeline's state pool, applied before the
	// server's own (its logger, retained checkpoints and hot-tier quota, which they cannot
	// override): tuning, or fault injection in tests (state.WithS3 with an HTTPClient).
	StateOptions []state.Option
	// KafkaSecrets resolves the secret names a tenant's Kafka specs use for SASL
	// (sasl.username_env, sasl.password_env); nil refuses SASL. See SecretsFromFile.
	KafkaSecrets func(tenant, name string) (string, bool)
}

// Server is the API over one control plane.
type Server struct {
	cfg      Config
	ctl      *control.Control
	engine   *abi.Engine
	log      *slog.Logger
	limiter  *limiter
	metrics  *metrics
	reg      *prometheus.Registry
	echo     *echo.Echo
	validate chan struct{}

	rt *runtime // nil when the runtime is off (no DataURL)
	// quit is closed when Serve begins shutting down: streaming answers (output?follow=1) end
	// then, so they do not hold the graceful shutdown up.
	quit     chan struct{}
	quitOnce sync.Once

	uploadsMu sync.Mutex
	uploads   map[string]chan struct{} // per-tenant upload slot, see uploadSlot

	// observeSink, when set before pipelines start, is called after every write to a preview
	// sink (ingest.RegisterObserved): benchmarks wait on it instead of polling.
	observeSink func(sink string, n int)
}

// New builds a server over ctl. When the catalog has no admin token and cfg.AdminToken is
// empty, it creates one and returns it (shown once by the caller); otherwise the returned token
// is "".
func New(ctx context.Context, ctl *control.Control, cfg Config) (*Server, string, error) {
	if cfg.MaxModuleBytes <= 0 {
		cfg.MaxModuleBytes = DefaultMaxModuleSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.RefreshInterval == 0 {
		cfg.RefreshInterval = 5 * time.Second
	}
	if cfg.ValidationConcurrency <= 0 {
		cfg.ValidationConcurrency = 2
	}
	created, err := ensureAdminToken(ctx, ctl, cfg.AdminToken)
	if err != nil {
		return nil, "", err
	}
	eng, err := abi.NewEngine(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("server: module validator: %w", err)
	}
	s := &Server{
		cfg: cfg, ctl: ctl, engine: eng, log: cfg.Logger,
		limiter:  newLimiter(cfg.Now),
		reg:      prometheus.NewRegistry(),
		validate: make(chan struct{}, cfg.ValidationConcurrency),
		uploads:  map[string]chan struct{}{},
		quit:     make(chan struct{}),
	}
	s.metrics = newMetrics(s.reg, ctl, func() *runtime { return s.rt })
	s.echo = s.buildEcho()
	if cfg.DataURL != "" {
		if s.cfg.RunDir == "" {
			s.cfg.RunDir = defaultRunDir(cfg.DataURL)
		}
		if s.cfg.MaxIngestBytes <= 0 {
			s.cfg.MaxIngestBytes = defaultMaxIngestBytes
		}
		s.rt = newRuntime(s)
		s.rt.resume(ctx)
	}
	return s, created, nil
}

// ensureAdminToken installs the admin token: the one given, or a new one when the catalog has
// none (returned so the caller can show it once).
func ensureAdminToken(ctx context.Context, ctl *control.Control, given string) (string, error) {
	if given != "" {
		if len(given) < 16 {
			return "", errors.New("server: CLINK_ADMIN_TOKEN must be at least 16 characters")
		}
		h := HashToken(given)
		if ctl.Snapshot().AdminTokenHash == h {
			return "", nil
		}
		return "", ctl.Update(ctx, func(cat *control.Catalog) error { cat.AdminTokenHash = h; return nil })
	}
	if ctl.Snapshot().AdminTokenHash != "" {
		return "", nil
	}
	tok := NewToken(adminTokenPrefix)
	err := ctl.Update(ctx, func(cat *control.Catalog) error {
		if cat.AdminTokenHash != "" {
			tok = "" // another process created it first
			return nil
		}
		cat.AdminTokenHash = HashToken(tok)
		return nil
	})
	return tok, err
}

// Handler is the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.echo }

// Close stops the running pipelines, each with a savepoint (they resume when a server starts
// on the same data again), and releases the validator.
func (s *Server) Close(ctx context.Context) error {
	if s.rt != nil {
		s.rt.close()
	}
	return s.engine.Close(ctx)
}

// defaultRunDir is run/ under a local data URL, else .clink/run.
func defaultRunDir(dataURL string) string {
	if !strings.Contains(dataURL, "://") {
		return filepath.Join(dataURL, "run")
	}
	if strings.HasPrefix(dataURL, "file://") {
		return filepath.Join(filepath.FromSlash(strings.TrimPrefix(dataURL, "file://")), "run")
	}
	return filepath.Join(".clink", "run")
}

// Serve answers on ln until ctx is done, then shuts down gracefully (bounded).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s.echo,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       5 * time.Minute, // a large module over a slow link
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	if s.cfg.RefreshInterval > 0 {
		done := make(chan struct{})
		defer close(done)
		go s.refreshLoop(ctx, done)
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	s.quitOnce.Do(func() { close(s.quit) })
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := hs.Shutdown(sctx)
	if e := <-errc; !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}

func (s *Server) refreshLoop(ctx context.Context, done <-chan struct{}) {
	t := time.NewTicker(s.cfg.RefreshInterval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.ctl.Refresh(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("re-reading the catalog failed; serving the last one read", "err", err)
			}
		}
	}
}

func (s *Server) buildEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.errorHandler
	e.Use(s.observe)
	for _, r := range s.routes() {
		h := r.handler
		if r.admin {
			inner := h
			h = func(c echo.Context) error {
				if err := requireAdmin(c); err != nil {
					return err
				}
				return inner(c)
			}
		}
		if !r.public {
			h = s.authenticate(h)
		}
		e.Add(r.method, r.path, h)
	}
	return e
}

// observe assigns a request id, logs the request and counts it.
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		id := c.Request().Header.Get(echo.HeaderXRequestID)
		if id == "" || len(id) > 64 {
			id = NewToken("")[:16]
		}
		c.Response().Header().Set(echo.HeaderXRequestID, id)
		c.Response().Header().Set("X-Content-Type-Options", "nosniff")
		err := func() (err error) {
			// A bug in a handler answers 500 and is logged with its stack; it never takes the
			// connection (or the process) down.
			defer func() {
				if r := recover(); r != nil {
					s.log.ErrorContext(c.Request().Context(), "handler panic", "id", id, "route", c.Path(), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			return next(c)
		}()
		if err != nil {
			c.Error(err)
		}
		route := c.Path()
		if route == "" || route == "/*" {
			route = "unmatched"
		}
		status := c.Response().Status
		el := time.Since(start)
		s.metrics.requests.WithLabelValues(c.Request().Method, route, fmt.Sprint(status)).Inc()
		s.metrics.latency.WithLabelValues(c.Request().Method, route).Observe(el.Seconds())
		p := principalOf(c)
		attrs := []any{"id", id, "method", c.Request().Method, "route", route, "status", status, "duration_ms", float64(el.Microseconds()) / 1000}
		if p.admin {
			attrs = append(attrs, "principal", "admin")
		} else if p.tenant != "" {
			attrs = append(attrs, "tenant", p.tenant)
		}
		level := slog.LevelInfo
		if status >= 500 {
			level = slog.LevelError
		}
		s.log.Log(c.Request().Context(), level, "request", attrs...)
		return nil
	}
}
