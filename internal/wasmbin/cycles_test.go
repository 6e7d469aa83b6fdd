package wasmbin_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// The one type of the modules below, () -> ().
var voidType = sec(1, vec([]byte{0x60, 0, 0}))

// voidFuncs declares n defined functions of type () -> ().
func voidFuncs(n int) []byte {
	decls := make([][]byte, n)
	for i := range decls {
		decls[i] = []byte{0}
	}
	return sec(3, vec(decls...))
}

// chain has n functions of type () -> (), each calling the next one calls times, and exports
// the first as "run". With calls > 1 it does calls^(n-1) calls without a loop or a cycle.
func chain(n, calls int) []byte {
	bodies := make([][]byte, n)
	for i := range n - 1 {
		var code []byte
		for range calls {
			code = append(code, 0x10)
			code = append(code, leb(uint32(i+1))...)
		}
		bodies[i] = body(noLocals, append(code, 0x0b)...)
	}
	bodies[n-1] = body(noLocals, 0x01, 0x0b) // nop
	return wasm(voidType, voidFuncs(n),
		sec(7, vec(cat(str("run"), []byte{0, 0}))),
		sec(10, vec(bodies...)))
}

// TestDeepAcyclicChain: a chain of 5000 functions, each calling the next, runs to its end and
// passes one check per function that calls.
func TestDeepAcyclicChain(t *testing.T) {
	const n = 5000
	f := &fuel{refill: 1}
	mod := instantiate(t, instrument(t, chain(n, 1)), f)
	if _, err := mod.ExportedFunction("run").Call(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f.calls != n-1 {
		t.Fatalf("%d fuel checks, want %d", f.calls, n-1)
	}
}

var errTooDeep = errors.New("host.back called too deep")

// TestCyclesStopped: calls that never return without a loop, through cycles of direct calls,
// of indirect calls, of typed references, through the host, and through an acyclic call graph
// too large to run, are stopped by the fuel import. Every function that calls has an entry
// check, so each of these passes one per call.
func TestCyclesStopped(t *testing.T) {
	tests := []struct {
		name string
		bin  []byte
	}{
		{"self recursion", wasm(voidType, voidFuncs(1),
			sec(7, vec(cat(str("run"), []byte{0, 0}))),
			sec(10, vec(body(noLocals, 0x10, 0, 0x0b))))},
		// run calls a, a calls b through the table, b calls a: only b is in the table.
		{"mutual recursion through call_indirect", wasm(voidType, voidFuncs(3),
			sec(4, vec([]byte{0x70, 0, 1})),
			sec(7, vec(cat(str("run"), []byte{0, 0}))),
			sec(9, vec(cat([]byte{0, 0x41, 0, 0x0b}, vec([]byte{2})))),
			sec(10, vec(
				body(noLocals, 0x10, 1, 0x0b),
				body(noLocals, 0x41, 0, 0x11, 0, 0, 0x0b),
				body(noLocals, 0x10, 1, 0x0b))))},
		// The same with tail calls, which never overflow the stack.
		{"mutual tail recursion through return_call_indirect", wasm(voidType, voidFuncs(3),
			sec(4, vec([]byte{0x70, 0, 1})),
			sec(7, vec(cat(str("run"), []byte{0, 0}))),
			sec(9, vec(cat([]byte{0, 0x41, 0, 0x0b}, vec([]byte{2})))),
			sec(10, vec(
				body(noLocals, 0x12, 1, 0x0b),
				body(noLocals, 0x41, 0, 0x13, 0, 0, 0x0b),
				body(noLocals, 0x12, 1, 0x0b))))},
		// a: return_call_ref (ref.func b); b: return_call a.
		{"mutual tail recursion through return_call_ref", wasm(voidType, voidFuncs(3),
			sec(7, vec(cat(str("run"), []byte{0, 0}))),
			sec(9, vec([]byte{0x03, 0x00, 0x01, 0x02})), // elem declare func b
			sec(10, vec(
				body(noLocals, 0x12, 1, 0x0b),
				body(noLocals, 0xd2, 2, 0x15, 0, 0x0b),
				body(noLocals, 0x12, 1, 0x0b))))},
		{"mutual tail recursion", wasm(voidType, voidFuncs(3),
			sec(7, vec(cat(str("run"), []byte{0, 0}))),
			sec(10, vec(
				body(noLocals, 0x12, 1, 0x0b),
				body(noLocals, 0x12, 2, 0x0b),
				body(noLocals, 0x12, 1, 0x0b))))},
		// 2^40 calls, acyclic.
		{"doubling chain", chain(41, 2)},
		// run calls a, a calls the import host.back, which calls run again.
		{"recursion through the host", wasm(voidType,
			sec(2, vec(cat(str("host"), str("back"), []byte{0, 0}))),
			voidFuncs(2),
			sec(7, vec(cat(str("run"), []byte{0, 1}))),
			sec(10, vec(body(noLocals, 0x10, 2, 0x0b), body(noLocals, 0x10, 0, 0x0b))))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Were a cycle left without a check, the call would overflow the stack (a trap,
			// not errOutOfFuel) or, with tail calls, not return: this deadline (through
			// WithCloseOnContextDone) or go test's own timeout would fail the test.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r := wazero.NewRuntimeWithConfig(ctx,
				wazero.NewRuntimeConfig().WithCoreFeatures(features).WithCloseOnContextDone(true))
			defer r.Close(ctx)
			f := &fuel{refill: 100, limit: 5}
			f.instantiate(t, r)
			// host.back calls run again, up to twice as many levels as the fuel lasts (each
			// level passes a check when run is entered): without checks the recursion would
			// end only with the Go stack, or the memory.
			depth := 0
			_, err := r.NewHostModuleBuilder("host").NewFunctionBuilder().
				WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, _ []uint64) {
					if depth++; depth > 2*int(f.refill)*f.limit {
						panic(errTooDeep)
					}
					if _, err := m.ExportedFunction("run").Call(ctx); err != nil {
						panic(err)
					}
				}), nil, nil).Export("back").Instantiate(ctx)
			if err != nil {
				t.Fatal(err)
			}
			mod, err := r.Instantiate(ctx, instrument(t, tt.bin))
			if err != nil {
				t.Fatal(err)
			}
			_, err = mod.ExportedFunction("run").Call(ctx)
			if !errors.Is(err, errOutOfFuel) {
				t.Fatalf("got %v, want %v", err, errOutOfFuel)
			}
		})
	}
}
