package abi

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/clink-wasm/clink-wasm/internal/wasmbin"
)

// Export names from docs/abi.md.
const (
	ExportMemory  = "memory"
	ExportInput   = "clink_input"
	ExportProcess = "clink_process"
	ExportOnTimer = "clink_on_timer"
	// ExportOnProcessingTimer fires processing-time timers (optional; docs/abi.md).
	ExportOnProcessingTimer = "clink_on_processing_timer"
	ExportOpen              = "clink_open"
	ExportClose             = "clink_close"
	ExportKey               = "clink_key"
	ExportManifest          = "clink_manifest"
	ExportInitialize        = "_initialize"
)

type sig struct{ params, results []api.ValueType }

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// exportSigs lists every export the ABI gives meaning to, with its required signature.
var exportSigs = map[string]sig{
	ExportInput:             {[]api.ValueType{i32}, []api.ValueType{i32}},
	ExportProcess:           {[]api.ValueType{i32, i32, i64}, []api.ValueType{i32}},
	ExportOnTimer:           {[]api.ValueType{i32, i64}, []api.ValueType{i32}},
	ExportOnProcessingTimer: {[]api.ValueType{i32, i64}, []api.ValueType{i32}},
	ExportOpen:              {nil, []api.ValueType{i32}},
	ExportClose:             {nil, []api.ValueType{i32}},
	ExportKey:               {[]api.ValueType{i32}, []api.ValueType{i64}},
	ExportManifest:          {nil, []api.ValueType{i64}},
	ExportInitialize:        {nil, nil},
	ExportMigrate:           {[]api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i64}},
	ExportStateVersions:     {nil, []api.ValueType{i64}},
	ExportProcessBatch:      {[]api.ValueType{i32}, []api.ValueType{i32}},
}

// wasiAllowed is the WASI preview 1 surface the host provides (docs/abi.md, "WASI"): all of
// wazero's implementation except sockets. Filesystem calls are present but there is nothing to
// open: no directory is preopened.
var wasiAllowed = map[string]bool{
	"args_get": true, "args_sizes_get": true, "environ_get": true, "environ_sizes_get": true,
	"clock_res_get": true, "clock_time_get": true, "random_get": true, "proc_exit": true,
	"proc_raise": true, "sched_yield": true, "poll_oneoff": true,
	"fd_advise": true, "fd_allocate": true, "fd_close": true, "fd_datasync": true,
	"fd_fdstat_get": true, "fd_fdstat_set_flags": true, "fd_fdstat_set_rights": true,
	"fd_filestat_get": true, "fd_filestat_set_size": true, "fd_filestat_set_times": true,
	"fd_pread": true, "fd_prestat_get": true, "fd_prestat_dir_name": true, "fd_pwrite": true,
	"fd_read": true, "fd_readdir": true, "fd_renumber": true, "fd_seek": true, "fd_sync": true,
	"fd_tell": true, "fd_write": true,
	"path_create_directory": true, "path_filestat_get": true, "path_filestat_set_times": true,
	"path_link": true, "path_open": true, "path_readlink": true, "path_remove_directory": true,
	"path_rename": true, "path_symlink": true, "path_unlink_file": true,
}

const wasiModule = "wasi_snapshot_preview1"

// Function describes an import or export for reports.
type Function struct {
	Module  string // import module; empty for exports
	Name    string
	Params  []api.ValueType
	Results []api.ValueType
}

func (f Function) String() string {
	var b strings.Builder
	if f.Module != "" {
		b.WriteString(f.Module)
		b.WriteByte('.')
	}
	b.WriteString(f.Name)
	b.WriteString(sigString(f.Params, f.Results))
	return b.String()
}

func sigString(params, results []api.ValueType) string {
	var b strings.Builder
	b.WriteByte('(')
	for i, p := range params {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(api.ValueTypeName(p))
	}
	b.WriteString(") -> (")
	for i, r := range results {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(api.ValueTypeName(r))
	}
	b.WriteByte(')')
	return b.String()
}

// Report is what Inspect finds out about a module: everything `clink-wasm inspect` prints.
type Report struct {
	Size           int
	ABIVersion     int    // from the import module name or the manifest; 0 if unknown
	ManifestSource string // "custom section", "export clink_manifest" or ""
	Manifest       *Manifest
	Imports        []Function
	Exports        []Function
	Memory         string // e.g. "min 1 page, max unbounded"
	// Problems lists everything that makes the module unusable, in the order found. An empty
	// list means the module loads.
	Problems []string
}

// Usable reports whether the module has no problems.
func (r *Report) Usable() bool { return len(r.Problems) == 0 }

func (r *Report) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// LoadError is returned by Engine.Load for a module that cannot be used.
type LoadError struct {
	Report *Report
}

func (e *LoadError) Error() string {
	if len(e.Report.Problems) == 1 {
		return "unusable module: " + e.Report.Problems[0]
	}
	return "unusable module:\n  - " + strings.Join(e.Report.Problems, "\n  - ")
}

// LoadOption tells Load and Inspect what the pipeline provides. The same style as EngineOption
// (and host/scheduler's and host/lookup's options): options apply in order.
type LoadOption interface{ apply(*loadConfig) }

type loadOptionFunc func(*loadConfig)

func (f loadOptionFunc) apply(c *loadConfig) { f(c) }

type loadConfig struct {
	// endpoints are the lookup endpoints the pipeline defines; checked says whether the
	// manifest's endpoints are checked against them at all (without WithEndpoints they are
	// not: inspect, the registry).
	endpoints []string
	checked   bool
}

// WithEndpoints names the lookup endpoints the pipeline defines: each endpoint the manifest
// declares must be among them (WithEndpoints() with no names: the pipeline defines none, so a
// module that declares any is refused). Without this option endpoints are not checked.
func WithEndpoints(names ...string) LoadOption {
	names = slices.Clone(names)
	return loadOptionFunc(func(c *loadConfig) { c.endpoints, c.checked = names, true })
}

func newLoadConfig(opts []LoadOption) loadConfig {
	var c loadConfig
	for _, o := range opts {
		o.apply(&c)
	}
	return c
}

// Module is a checked, instrumented and compiled operator module. It is safe for concurrent use;
// instances are not.
type Module struct {
	e        *Engine
	compiled wazero.CompiledModule
	Manifest Manifest
	Report   *Report

	hasOnTimer, hasOpen, hasClose, hasKey, hasInitialize bool
	hasBatch                                             bool // exports clink_process_batch (batch.go)
	hasOnProcTimer                                       bool
	manifestFromExport                                   bool
	prefetchIDs                                          []uint32
}

// Load checks bin against the ABI, instruments it, compiles it and reads its manifest. A module
// that cannot be used yields a *LoadError listing every problem found.
func (e *Engine) Load(ctx context.Context, bin []byte, opts ...LoadOption) (*Module, error) {
	m, rep := e.load(ctx, bin, newLoadConfig(opts))
	if !rep.Usable() {
		if m != nil && m.compiled != nil {
			_ = m.compiled.Close(ctx)
		}
		return nil, &LoadError{Report: rep}
	}
	return m, nil
}

// Inspect runs the load-time checks and reports what it found without keeping the module.
func (e *Engine) Inspect(ctx context.Context, bin []byte, opts ...LoadOption) *Report {
	m, rep := e.load(ctx, bin, newLoadConfig(opts))
	if m != nil && m.compiled != nil {
		_ = m.compiled.Close(ctx)
	}
	return rep
}

func (e *Engine) load(ctx context.Context, bin []byte, opts loadConfig) (*Module, *Report) {
	rep := &Report{Size: len(bin)}
	if len(bin) < 8 || !bytes.Equal(bin[:4], []byte("\x00asm")) {
		rep.problem("not a WebAssembly module (the file does not start with the \\0asm magic)")
		return nil, rep
	}
	if v := binary.LittleEndian.Uint32(bin[4:8]); v != 1 {
		rep.problem("unsupported WebAssembly binary version %d (only version 1, the core format, is supported; components are not)", v)
		return nil, rep
	}
	inst, err := wasmbin.Instrument(bin)
	if err != nil {
		rep.problem("invalid WebAssembly module: %v", err)
		return nil, rep
	}
	compiled, err := e.compile(ctx, inst)
	if err != nil {
		rep.problem("invalid WebAssembly module: %v", err)
		return nil, rep
	}
	m := &Module{e: e, compiled: compiled, Report: rep}
	m.checkImports(rep)
	m.checkExports(rep)
	m.readManifest(ctx, rep)
	m.readStateVersions(ctx, rep) // migrate.go
	if rep.Manifest != nil && opts.checked {
		defined := make(map[string]bool, len(opts.endpoints))
		for _, n := range opts.endpoints {
			defined[n] = true
		}
		for _, n := range rep.Manifest.Endpoints {
			if !defined[n] {
				rep.problem("module declares lookup endpoint %q but the pipeline defines no such endpoint", n)
			}
		}
	}
	if rep.Manifest != nil {
		m.Manifest = *rep.Manifest
		m.prefetchIDs = m.Manifest.PrefetchIDs()
	}
	return m, rep
}

func (m *Module) checkImports(rep *Report) {
	for _, mem := range m.compiled.ImportedMemories() {
		mod, name, _ := mem.Import()
		rep.problem("imports memory %s.%s: an operator must define and export its own memory", mod, name)
	}
	for _, d := range m.compiled.ImportedFunctions() {
		mod, name, _ := d.Import()
		if mod == wasmbin.FuelImportModule {
			continue // added by the instrumenter
		}
		f := Function{Module: mod, Name: name, Params: d.ParamTypes(), Results: d.ResultTypes()}
		rep.Imports = append(rep.Imports, f)
		switch {
		case mod == ImportModule:
			rep.noteVersion(Version, "imports")
			imp, ok := importByName[name]
			if !ok {
				rep.problem("imports %s.%s, which ABI v%d does not define", mod, name, Version)
			} else if !sameTypes(imp.params, f.Params) || !sameTypes(imp.results, f.Results) {
				rep.problem("imports %s.%s with signature %s; ABI v%d defines %s", mod, name,
					sigString(f.Params, f.Results), Version, sigString(imp.params, imp.results))
			}
		case strings.HasPrefix(mod, "clink_v"):
			if v, err := strconv.Atoi(strings.TrimPrefix(mod, "clink_v")); err == nil {
				rep.noteVersion(v, "imports")
				rep.problem("module targets clink ABI v%d (it imports %s.%s); this host supports v%d", v, mod, name, Version)
			} else {
				rep.problem("imports %s.%s, which the host does not provide", mod, name)
			}
		case mod == wasiModule:
			switch {
			case strings.HasPrefix(name, "sock_"):
				rep.problem("imports %s.%s: sockets are not available to operators (use the lookup import for HTTP)", mod, name)
			case !wasiAllowed[name]:
				rep.problem("imports %s.%s, which the host's WASI does not provide", mod, name)
			}
		default:
			rep.problem("imports %s.%s, which the host does not provide (allowed: %s, %s)", mod, name, ImportModule, wasiModule)
		}
	}
	// Imported tables and globals are refused too: the host provides none.
	// (wazero reports them only at instantiation; the instrumenter keeps them, so instantiation
	// would fail with a clear wazero message.)
}

func (rep *Report) noteVersion(v int, _ string) {
	if rep.ABIVersion == 0 {
		rep.ABIVersion = v
	}
}

func (m *Module) checkExports(rep *Report) {
	exports := m.compiled.ExportedFunctions()
	names := make([]string, 0, len(exports))
	for n := range exports {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		d := exports[n]
		f := Function{Name: n, Params: d.ParamTypes(), Results: d.ResultTypes()}
		rep.Exports = append(rep.Exports, f)
		if want, ok := exportSigs[n]; ok && (!sameTypes(want.params, f.Params) || !sameTypes(want.results, f.Results)) {
			rep.problem("export %s has signature %s; ABI v%d requires %s", n, sigString(f.Params, f.Results), Version, sigString(want.params, want.results))
		}
	}
	if _, ok := exports["_start"]; ok {
		rep.problem("module is a WASI command (it exports _start); build it as a reactor (C: clang -mexec-model=reactor; Rust: crate-type cdylib, linking crt1-reactor.o; Go: -buildmode=c-shared; AssemblyScript: --exportStart _initialize; see docs/abi.md, \"Building a reactor\")")
	}
	mems := m.compiled.ExportedMemories()
	if md, ok := mems[ExportMemory]; !ok {
		rep.problem("missing export %q (the guest's linear memory)", ExportMemory)
	} else {
		max, bounded := md.Max()
		if bounded {
			rep.Memory = fmt.Sprintf("min %d pages, max %d pages (limit %d)", md.Min(), max, m.e.limits.MemoryPages)
		} else {
			rep.Memory = fmt.Sprintf("min %d pages, max unbounded (limit %d)", md.Min(), m.e.limits.MemoryPages)
		}
		if md.Min() > m.e.limits.MemoryPages {
			rep.problem("memory needs at least %d pages; the limit is %d", md.Min(), m.e.limits.MemoryPages)
		}
	}
	for _, req := range []string{ExportInput, ExportProcess} {
		if _, ok := exports[req]; !ok {
			rep.problem("missing export %s%s", req, sigString(exportSigs[req].params, exportSigs[req].results))
		}
	}
	_, m.hasOnTimer = exports[ExportOnTimer]
	_, m.hasOnProcTimer = exports[ExportOnProcessingTimer]
	_, m.hasOpen = exports[ExportOpen]
	_, m.hasClose = exports[ExportClose]
	_, m.hasKey = exports[ExportKey]
	_, m.hasInitialize = exports[ExportInitialize]
	_, m.hasBatch = exports[ExportProcessBatch]
}

func (m *Module) readManifest(ctx context.Context, rep *Report) {
	for _, cs := range m.compiled.CustomSections() {
		if cs.Name() != ManifestSection {
			continue
		}
		rep.ManifestSource = "custom section " + ManifestSection
		m.parseManifest(cs.Data(), rep)
		return
	}
	if _, ok := m.compiled.ExportedFunctions()[ExportManifest]; !ok {
		rep.problem("no manifest: add a %q custom section or export %s() -> i64", ManifestSection, ExportManifest)
		return
	}
	rep.ManifestSource = "export " + ExportManifest
	m.manifestFromExport = true
	if len(rep.Problems) > 0 {
		// Instantiating a module with bad imports or exports would only add noise.
		rep.problem("manifest not read: fix the problems above first")
		return
	}
	b, err := m.callManifest(ctx)
	if err != nil {
		rep.problem("reading the manifest: %v", err)
		return
	}
	m.parseManifest(b, rep)
}

func (m *Module) parseManifest(b []byte, rep *Report) {
	man, err := ParseManifest(b)
	if man.ABI != 0 && rep.ABIVersion == 0 {
		rep.ABIVersion = man.ABI
	}
	if err != nil && man.ABI != Version && man.ABI == rep.ABIVersion && len(rep.Problems) > 0 {
		return // the imports already told that the module targets another ABI version
	}
	if err != nil {
		rep.problem("%v", err)
		return
	}
	if rep.ABIVersion != 0 && rep.ABIVersion != man.ABI {
		rep.problem("manifest says ABI v%d but the module imports from clink_v%d", man.ABI, rep.ABIVersion)
		return
	}
	rep.Manifest = &man
}

// callManifest instantiates a throwaway instance and calls clink_manifest on it.
func (m *Module) callManifest(ctx context.Context) ([]byte, error) {
	in, err := m.instantiate(ctx, discardHandler{})
	if err != nil {
		return nil, err
	}
	defer in.discard(ctx)
	b, err := in.manifest()
	if err != nil {
		return nil, err
	}
	return bytes.Clone(b), nil
}

func sameTypes(a, b []api.ValueType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Close releases the compiled module.
func (m *Module) Close(ctx context.Context) error { return m.compiled.Close(ctx) }

// HasOnTimer reports whether the module exports clink_on_timer.
func (m *Module) HasOnTimer() bool { return m.hasOnTimer }

// HasOnProcessingTimer reports whether the module exports clink_on_processing_timer.
func (m *Module) HasOnProcessingTimer() bool { return m.hasOnProcTimer }

// HasKey reports whether the module exports the key function clink_key.
func (m *Module) HasKey() bool { return m.hasKey }

// Name is the operator name from the manifest.
func (m *Module) Name() string { return m.Manifest.Name }

// Engine returns the engine the module was loaded by.
func (m *Module) Engine() *Engine { return m.e }

var errNoManifest = errors.New("no manifest")

// discardHandler serves a probe instance, where every import is refused.
type discardHandler struct{}

func (discardHandler) Get(uint32, []byte) ([]byte, bool, error) { return nil, false, NotAllowed }
func (discardHandler) Put(uint32, []byte, []byte) error         { return NotAllowed }
func (discardHandler) Delete(uint32, []byte) error              { return NotAllowed }
func (discardHandler) Emit([]byte, []byte) error                { return NotAllowed }
func (discardHandler) RegisterTimer(int64) error                { return NotAllowed }
func (discardHandler) DeleteTimer(int64) error                  { return NotAllowed }
func (discardHandler) Watermark() int64                         { return minWatermark }
func (discardHandler) Lookup(uint32, []byte) (int, []byte, error) {
	return 0, nil, NotAllowed
}
func (discardHandler) Log(LogLevel, []byte) {}
func (discardHandler) SetResumeOrder(int64) {}
