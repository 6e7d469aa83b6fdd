package abi

import (
	"context"
	"errors"
	"fmt"
	"sync"

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

	closeOnce sync.Once
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
	e.wd = newWatchdog(cfg.limits.CallTime)
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
