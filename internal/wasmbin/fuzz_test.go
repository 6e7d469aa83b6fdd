package wasmbin_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/clink-wasm/clink-wasm/internal/wasmbin"
)

// FuzzInstrument checks that Instrument never panics, never modifies its
// input, only fails with a *wasmbin.Error, and that whenever wazero accepts
// the input, it accepts the output too. Validity is checked twice: with the
// default feature set (what the host uses) and with every feature wazero has.
// The interpreter is used because it validates exactly like the compiler and
// compiles much faster.
//
// Run it with: go test ./internal/wasmbin/ -run '^$' -fuzz FuzzInstrument
func FuzzInstrument(f *testing.F) {
	seeds, err := filepath.Glob("testdata/*.wasm")
	if err != nil {
		f.Fatal(err)
	}
	for _, path := range seeds {
		f.Add(readFixture(f, path[len("testdata/"):]))
	}
	f.Add(typedRefs)
	f.Add(oneFunc(0xfd, 0x80, 0x01, 0x0b))

	ctx := context.Background()
	runtimes := []wazero.Runtime{
		wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter()),
		wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter().WithCoreFeatures(features)),
	}
	f.Cleanup(func() {
		for _, r := range runtimes {
			_ = r.Close(ctx)
		}
	})
	f.Fuzz(func(t *testing.T, bin []byte) {
		in := bytes.Clone(bin)
		out, err := wasmbin.Instrument(bin)
		if !bytes.Equal(in, bin) {
			t.Fatal("Instrument modified its input")
		}
		var e *wasmbin.Error
		if err != nil && !errors.As(err, &e) {
			t.Fatalf("error %v is a %T, not a *wasmbin.Error", err, err)
		}
		if err != nil && out != nil {
			t.Fatal("output returned with an error")
		}
		for _, r := range runtimes {
			if err == nil && compiles(ctx, r, out) {
				continue // whatever the input was, the output is fine
			}
			// The output is rejected or missing: a bug if wazero accepts the input.
			if !boundedLEB(bin) || !compiles(ctx, r, bin) {
				continue
			}
			if err == nil {
				t.Fatal("wazero accepts the input but not the output")
			}
			if !refusedOnPurpose(err) {
				t.Fatalf("wazero accepts the input, Instrument refuses it: %v", err)
			}
		}
	})
}

// refusedOnPurpose reports whether Instrument refuses input that wazero may
// accept by design: imports of the reserved module, and code wazero
// validates but miscompiles (see instr.go).
func refusedOnPurpose(err error) bool {
	return errors.Is(err, wasmbin.ErrReservedImport) || strings.Contains(err.Error(), "miscompiles")
}

// boundedLEB reports whether every LEB128 value in bin is below 2^14, that is,
// no two consecutive bytes have the continuation bit. wazero v1.12 allocates
// vectors, locals and names at the length the input claims before reading
// them, so a few bytes of malformed input can make it allocate gigabytes (the
// output of Instrument is safe from this: it refuses such lengths or drops the
// name section that holds them). Such inputs are not given to wazero here.
func boundedLEB(bin []byte) bool {
	for i := 1; i < len(bin); i++ {
		if bin[i-1] >= 0x80 && bin[i] >= 0x80 {
			return false
		}
	}
	return true
}

// compiles reports whether wazero accepts bin. wazero v1.12 itself panics on
// some invalid input (for example, with exception handling enabled, a throw
// of a tag whose type index is out of range: see the seed corpus), which
// counts as not accepted.
func compiles(ctx context.Context, r wazero.Runtime, bin []byte) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	c, err := r.CompileModule(ctx, bin)
	if err != nil {
		return false
	}
	_ = c.Close(ctx)
	return true
}
