package wasmbin_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// Types of the modules below: 0 is () -> (), 1 is () -> i32.
var checkTypes = sec(1, vec([]byte{0x60, 0, 0}, []byte{0x60, 0, 1, 0x7f}))

// funcsOfType declares n defined functions of type t.
func funcsOfType(n int, t byte) []byte {
	decls := make([][]byte, n)
	for i := range decls {
		decls[i] = []byte{t}
	}
	return sec(3, vec(decls...))
}

// importTypes and importTriple import env.triple: (i32) -> i32, as function 0; type 0 is
// () -> i32.
var (
	importTypes  = sec(1, vec([]byte{0x60, 0, 1, 0x7f}, []byte{0x60, 1, 0x7f, 1, 0x7f}))
	importTriple = sec(2, vec(cat(str("env"), str("triple"), []byte{0, 1})))
)

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
	return wasm(checkTypes, funcsOfType(n, 0),
		sec(7, vec(cat(str("run"), []byte{0, 0}))),
		sec(10, vec(bodies...)))
}

// TestEntryChecks counts the checks of functions without loops: only those that can be part of
// a cycle of calls, or that would otherwise run too much code unchecked, keep theirs.
func TestEntryChecks(t *testing.T) {
	tests := []struct {
		name string
		bin  []byte
		want int // fuel checks per call of run, with a refill of 1
	}{
		{"leaf", wasm(checkTypes, funcsOfType(1, 1),
			sec(7, vec(cat(str("run"), []byte{0, 0}))),
			sec(10, vec(body(noLocals, 0x41, 7, 0x0b)))), 0},
		// Exported, but it cannot reach an import or an indirect call: no cycle can enter it.
		{"caller of a leaf", wasm(checkTypes, funcsOfType(2, 1),
			sec(7, vec(cat(str("run"), []byte{0, 1}))),
			sec(10, vec(body(noLocals, 0x41, 7, 0x0b), body(noLocals, 0x10, 0, 0x0b)))), 0},
		{"deep acyclic chain", chain(500, 1), 0},
		// The host could call run back from the import (see TestCyclesStopped).
		{"exported caller of an import", wasm(importTypes, importTriple, funcsOfType(1, 0),
			sec(7, vec(cat(str("run"), []byte{0, 1}))),
			sec(10, vec(body(noLocals, 0x41, 7, 0x10, 0, 0x0b)))), 1},
		// h is not exported and not in a table: only run's calls enter it, and run's entry check
		// is the only one.
		{"helper calling an import", wasm(importTypes, importTriple, funcsOfType(2, 0),
			sec(7, vec(cat(str("run"), []byte{0, 1}))),
			sec(10, vec(
				body(noLocals, 0x10, 2, 0x1a, 0x10, 2, 0x1a, 0x10, 2, 0x0b),
				body(noLocals, 0x41, 7, 0x10, 0, 0x0b)))), 1},
		// 2^12 calls of the last function: the cost bound puts checks in.
		{"doubling chain", chain(13, 2), -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fuel{refill: 1}
			mod := instantiate(t, instrument(t, tt.bin), f)
			for range 3 {
				if _, err := mod.ExportedFunction("run").Call(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			switch {
			case tt.want < 0 && f.calls == 0:
				t.Fatal("no fuel checks")
			case tt.want >= 0 && f.calls != 3*tt.want:
				t.Fatalf("3 calls made %d fuel checks, want %d", f.calls, 3*tt.want)
			}
		})
	}
}

var errTooDeep = errors.New("host.back called too deep")

// TestCyclesStopped: calls that never return without a loop, through cycles of direct calls,
// of indirect calls, of typed references, through the host, and through an acyclic call graph
// too large to run, are stopped by the fuel import.
func TestCyclesStopped(t *testing.T) {
	tests := []struct {
		name string
		bin  []byte
	}{
		{"self recursion", wasm(checkTypes, funcsOfType(1, 0),
			sec(7, vec(cat(str("run"), []byte{0, 0}))),
			sec(10, vec(body(noLocals, 0x10, 0, 0x0b))))},
		// run calls a, a calls b through the table, b calls a: only b is in the table.
		{"mutual recursion through call_indirect", wasm(checkTypes, funcsOfType(3, 0),
			sec(4, vec([]byte{0x70, 0, 1})),
			sec(7, vec(cat(str("run"), []byte{0, 0}))),
			sec(9, vec(cat([]byte{0, 0x41, 0, 0x0b}, vec([]byte{2})))),
			sec(10, vec(
				body(noLocals, 0x10, 1, 0x0b),
				body(noLocals, 0x41, 0, 0x11, 0, 0, 0x0b),
				body(noLocals, 0x10, 1, 0x0b))))},
		// The same with tail calls, which never overflow the stack.
		{"mutual tail recursion through return_call_indirect", wasm(checkTypes, funcsOfType(3, 0),
			sec(4, vec([]byte{0x70, 0, 1})),
			sec(7, vec(cat(str("run"), []byte{0, 0}))),
			sec(9, vec(cat([]byte{0, 0x41, 0, 0x0b}, vec([]byte{2})))),
			sec(10, vec(
				body(noLocals, 0x12, 1, 0x0b),
				body(noLocals, 0x41, 0, 0x13, 0, 0, 0x0b),
				body(noLocals, 0x12, 1, 0x0b))))},
		// a: return_call_ref (ref.func b); b: return_call a.
		{"mutual tail recursion through return_call_ref", wasm(checkTypes, funcsOfType(3, 0),
			sec(7, vec(cat(str("run"), []byte{0, 0}))),
			sec(9, vec([]byte{0x03, 0x00, 0x01, 0x02})), // elem declare func b
			sec(10, vec(
				body(noLocals, 0x12, 1, 0x0b),
				body(noLocals, 0xd2, 2, 0x15, 0, 0x0b),
				body(noLocals, 0x12, 1, 0x0b))))},
		{"mutual tail recursion", wasm(checkTypes, funcsOfType(3, 0),
			sec(7, vec(cat(str("run"), []byte{0, 0}))),
			sec(10, vec(
				body(noLocals, 0x12, 1, 0x0b),
				body(noLocals, 0x12, 2, 0x0b),
				body(noLocals, 0x12, 1, 0x0b))))},
		// 2^40 calls, acyclic.
		{"doubling chain", chain(41, 2)},
		// run calls a, a calls the import host.back, which calls run again.
		{"recursion through the host", wasm(checkTypes,
			sec(2, vec(cat(str("host"), str("back"), []byte{0, 0}))),
			funcsOfType(2, 0),
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
