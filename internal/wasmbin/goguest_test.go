package wasmbin_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// goGuest returns testdata/goguest.wasm: real Go toolchain output (a
// -buildmode=c-shared WASI reactor, 2.6 MB, 1788 functions), built by gen.sh
// from testdata/goguest/main.go and committed gzipped.
var goGuest = sync.OnceValues(func() ([]byte, error) {
	gz, err := os.ReadFile("testdata/goguest.wasm.gz")
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(zr)
})

// TestGoGuest instruments the Go module, runs _initialize and the exports in
// both the original and the instrumented module, and stops an endless loop.
//
// Compiling 2.6 MB of wasm takes about a second with wazero's optimising
// compiler, so with -short only the interpreter runs it.
func TestGoGuest(t *testing.T) {
	bin, err := goGuest()
	if err != nil {
		t.Fatal(err)
	}
	out := instrument(t, bin)
	engines := []struct {
		name string
		cfg  func() wazero.RuntimeConfig
	}{
		{"interpreter", wazero.NewRuntimeConfigInterpreter},
		{"compiler", wazero.NewRuntimeConfigCompiler},
	}
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			if e.name == "compiler" && testing.Short() {
				t.Skip("slow compile; skipped with -short")
			}
			t.Parallel()
			ctx := context.Background()
			start := func(bin []byte, f *fuel) api.Module {
				r := wazero.NewRuntimeWithConfig(ctx, e.cfg().WithCompilationCache(cache))
				t.Cleanup(func() { _ = r.Close(ctx) })
				wasi_snapshot_preview1.MustInstantiate(ctx, r)
				if f != nil {
					f.instantiate(t, r)
				}
				mod, err := r.InstantiateWithConfig(ctx, bin, wazero.NewModuleConfig().WithStartFunctions())
				if err != nil {
					t.Fatal(err)
				}
				if _, err := mod.ExportedFunction("_initialize").Call(ctx); err != nil {
					t.Fatal(err)
				}
				return mod
			}
			orig := start(bin, nil)
			f := &fuel{refill: 1000}
			inst := start(out, f)
			for _, c := range []call{
				c("sum", 1000).returns(500500),
				c("work", 500),
				c("work", 1000),
			} {
				want, err := callExport(ctx, orig, c.fn, c.args...)
				if err != nil {
					t.Fatal(err)
				}
				got, err := callExport(ctx, inst, c.fn, c.args...)
				if err != nil {
					t.Fatal(err)
				}
				if got[0] != want[0] || (c.want != nil && want[0] != c.want[0]) {
					t.Errorf("%s%v: instrumented %v, original %v, want %v", c.fn, c.args, got, want, c.want)
				}
			}
			if f.calls == 0 {
				t.Error("the fuel import was never called")
			}
			f.limit = f.calls + 10
			if _, err := inst.ExportedFunction("spin").Call(ctx); !errors.Is(err, errOutOfFuel) {
				t.Errorf("spin: got %v, want %v", err, errOutOfFuel)
			}
		})
	}
}
