package abi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/clink-wasm/clink-wasm/internal/wasmbin"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// Engine compiles and instantiates operator modules. It owns one wazero runtime with the host
// modules (`clink_v1`, the fuel check, a sandboxed WASI) and applies one set of Limits. Engines
// with different memory limits need separate runtimes; they share compiled code through a
// compilation cache.
//
// An Engine is safe for concurrent use.
type Engine struct {
	rt     wazero.Runtime
	limits Limits
	cache  wazero.CompilationCache
	owns   bool   // whether Close closes cache
	dir    string // the on-disk cache's directory, when the engine opened it (cache.go)
	wd     *watchdog
	rel    *releaser // closes closed instances' modules off the caller's path (release.go)

	// The live limits (SetLiveLimits): every instance reads them at each check, so a change
	// reaches instances already running. 0 = the engine's limits.
	liveCallTime atomic.Int64  // nanoseconds
	liveMemPages atomic.Uint32 // at most limits.MemoryPages (the reservation)

	share *CPUShare // nil: guests are not throttled (cpushare.go)

	closeOnce sync.Once
}

// SetLiveLimits changes the call time limit and the linear-memory limit of the engine's
// instances, running ones included (a live quota change). callTime applies from each call's
// next fuel check (a call that already ran longer fails there); memoryPages refuses any later
// memory.grow past it (the guest sees -1, as at the limit) but takes no memory away from an
// instance that has it already, and cannot exceed the engine's MemoryPages (the reservation
// each instance was created with: raising past it needs a new engine). 0 leaves one as it is.
func (e *Engine) SetLiveLimits(callTime time.Duration, memoryPages uint32) {
	if callTime > 0 {
		e.liveCallTime.Store(int64(callTime))
	}
	if memoryPages > 0 {
		e.liveMemPages.Store(min(memoryPages, e.limits.MemoryPages))
	}
}

// callTime is the call time limit in force.
func (e *Engine) callTime() time.Duration {
	if d := e.liveCallTime.Load(); d > 0 {
		return time.Duration(d)
	}
	return e.limits.CallTime
}

// memoryPages is the linear-memory limit in force, in pages.
func (e *Engine) memoryPages() uint32 {
	if p := e.liveMemPages.Load(); p > 0 {
		return p
	}
	return e.limits.MemoryPages
}

// EngineOption configures an Engine (see NewEngine). The same style as host/state,
// host/scheduler and host/lookup: options apply in order, defaults are filled in once.
type EngineOption interface{ apply(*engineConfig) }

type engineOptionFunc func(*engineConfig)

func (f engineOptionFunc) apply(c *engineConfig) { f(c) }

type engineConfig struct {
	limits   Limits
	cache    wazero.CompilationCache
	cacheDir string
	share    *CPUShare
}

// WithLimits sets the limits the engine's instances run under.
func WithLimits(l Limits) EngineOption {
	return engineOptionFunc(func(c *engineConfig) { c.limits = l })
}

// WithCompilationCache shares compiled code with other engines.
func WithCompilationCache(cc wazero.CompilationCache) EngineOption {
	return engineOptionFunc(func(c *engineConfig) { c.cache = cc })
}

// WithCompilationCacheDir persists compiled code in dir, so that a module compiles once per
// machine rather than once per process.
func WithCompilationCacheDir(dir string) EngineOption {
	return engineOptionFunc(func(c *engineConfig) { c.cacheDir = dir })
}

// NewEngine returns an engine ready to load modules.
func NewEngine(ctx context.Context, opts ...EngineOption) (*Engine, error) {
	warmWazero.Do(warmWazeroVersion)
	var cfg engineConfig
	for _, o := range opts {
		o.apply(&cfg)
	}
	cfg.limits = cfg.limits.withDefaults()
	e := &Engine{limits: cfg.limits, cache: cfg.cache}
	if e.cache == nil {
		e.owns = true
		if cfg.cacheDir != "" {
			cc, err := wazero.NewCompilationCacheWithDir(cfg.cacheDir)
			if err != nil {
				return nil, fmt.Errorf("abi: compilation cache in %s: %w", cfg.cacheDir, err)
			}
			e.cache, e.dir = cc, cfg.cacheDir
		} else {
			e.cache = wazero.NewCompilationCache()
		}
	}
	e.rt = wazero.NewRuntimeWithConfig(ctx, e.runtimeConfig(e.cache))
	if err := e.instantiateHostModules(ctx); err != nil {
		_ = e.rt.Close(ctx)
		if e.owns {
			_ = e.cache.Close(ctx)
		}
		return nil, err
	}
	e.share = cfg.share
	period := watchdogPeriod(cfg.limits.CallTime)
	if e.share != nil {
		period = min(period, cpuSharePeriod)
	}
	e.wd = newWatchdog(period)
	e.rel = newReleaser()
	return e, nil
}

// runtimeConfig is the configuration of every runtime the engine creates, over cache.
func (e *Engine) runtimeConfig(cache wazero.CompilationCache) wazero.RuntimeConfig {
	return wazero.NewRuntimeConfig().
		WithCompilationCache(cache).
		WithMemoryLimitPages(e.limits.MemoryPages).
		WithCustomSections(true).
		WithCloseOnContextDone(false) // see fuel.go: we stop runaway guests ourselves, cheaply
}

// Limits returns the engine's limits, with defaults filled in.
func (e *Engine) Limits() Limits { return e.limits }

// Close releases the runtime and every module and instance created by it.
func (e *Engine) Close(ctx context.Context) error {
	var err error
	e.closeOnce.Do(func() {
		e.wd.close()
		e.rel.close()
		err = e.rt.Close(ctx)
		if e.owns {
			err = errors.Join(err, e.cache.Close(ctx))
		}
	})
	return err
}

func (e *Engine) instantiateHostModules(ctx context.Context) error {
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, e.rt); err != nil {
		return fmt.Errorf("abi: instantiating WASI: %w", err)
	}
	b := e.rt.NewHostModuleBuilder(ImportModule)
	for _, imp := range clinkImports {
		b.NewFunctionBuilder().
			WithGoFunction(imp.fn, imp.params, imp.results).
			WithParameterNames(imp.paramNames...).
			Export(imp.name)
	}
	if _, err := b.Instantiate(ctx); err != nil {
		return fmt.Errorf("abi: instantiating %s: %w", ImportModule, err)
	}
	fb := e.rt.NewHostModuleBuilder(wasmbin.FuelImportModule)
	fb.NewFunctionBuilder().
		WithGoFunction(api.GoFunc(fuelExhausted), nil, []api.ValueType{api.ValueTypeI32}).
		Export(wasmbin.FuelImportName)
	if _, err := fb.Instantiate(ctx); err != nil {
		return fmt.Errorf("abi: instantiating %s: %w", wasmbin.FuelImportModule, err)
	}
	return nil
}

// warmWazero makes wazero cache its own version before any two engines are created at once:
// wazero (v1.12) memoizes it in an unsynchronized package variable on first use (by the
// compiler engine and by a compilation cache directory), which is a data race when the first
// engines are made concurrently (the scale-out worker starts a job per partition). Once it is
// cached, later uses only read it.
var warmWazero sync.Once

func warmWazeroVersion() {
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
	_ = rt.Close(ctx)
}
