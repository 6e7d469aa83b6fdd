package wasmbin_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/clink-wasm/clink-wasm/internal/wasmbin"
)

// FuzzInstrumentPrograms complements FuzzInstrument, whose mutated inputs are
// rarely valid modules: it decodes the fuzz input into a valid, terminating
// program (nested counted loops, loops with parameters, blocks, if/else,
// br_table, early returns, direct, indirect and tail calls, an import), runs
// it before and after instrumentation, and requires the same results. The
// fuel import refills only a few units at a time, so it runs throughout.
//
// Run it with: go test ./internal/wasmbin/ -run '^$' -fuzz FuzzInstrumentPrograms
func FuzzInstrumentPrograms(f *testing.F) {
	for _, seed := range []string{
		"", "\x02\x03\x01\x05\x02\x07\x04\x09",
		"\x02\x01\x01\x01\x01\x06\x02\x04\x03\x07\x05\x00\x08\x03",
		"\x01\x04\x06\x06\x06\x01\x01\x01\x07\x03\x02\x09\x05\x0a",
	} {
		f.Add([]byte(seed))
	}
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter().WithCoreFeatures(features))
	f.Cleanup(func() { _ = r.Close(ctx) })
	_, err := r.NewHostModuleBuilder("env").
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, stack []uint64) {
			stack[0] = api.EncodeI32(api.DecodeI32(stack[0])*5 + 1)
		}), []api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}).
		Export("imp").
		Instantiate(ctx)
	if err != nil {
		f.Fatal(err)
	}
	fl := &fuel{}
	fl.instantiate(f, r)
	var seq atomic.Int64
	f.Fuzz(func(t *testing.T, data []byte) {
		bin, checked := genProgram(data)
		out, err := wasmbin.Instrument(bin)
		if err != nil {
			t.Fatal(err)
		}
		run := func(bin []byte) []uint64 {
			mod, err := r.InstantiateWithConfig(ctx, bin,
				wazero.NewModuleConfig().WithName(fmt.Sprint("p", seq.Add(1))))
			if err != nil {
				t.Fatalf("%v\nmodule: % x", err, bin)
			}
			defer mod.Close(ctx)
			var res []uint64
			for _, arg := range []uint64{0, 1, 6, 7} {
				v, err := mod.ExportedFunction("run").Call(ctx, arg)
				if err != nil {
					t.Fatal(err)
				}
				res = append(res, v[0]&0xffffffff, mod.ExportedGlobal("acc").Get()&0xffffffff)
			}
			return res
		}
		fl.refill = 1
		if len(data) > 0 {
			fl.refill = 1 + int32(data[0]%5)
		}
		want := run(bin)
		fl.calls = 0
		got := run(out)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("instrumented results %v, original %v\nmodule: % x", got, want, bin)
		}
		// Functions with neither a loop nor a call have no check (see dropLeafCheck).
		if checked && fl.calls == 0 {
			t.Fatal("the fuel import was never called")
		}
		if !checked && fl.calls != 0 {
			t.Fatalf("the fuel import was called %d times by a program of leaf functions", fl.calls)
		}
	})
}

// genProgram decodes data into a module exporting run: (i32) -> i32 and a
// mutable global acc. Functions are f0 (run) ... fn-1, all (i32) -> i32, and
// f_i only calls f_j for j > i, so every program terminates; loops count down
// locals of their own and run at most 3 times. checked reports whether any
// function has a loop or a call, and so a fuel check.
func genProgram(data []byte) (bin []byte, checked bool) {
	g := &progGen{data: data}
	nfuncs := 1 + int(g.byte()%3)
	var bodies [][]byte
	for i := range nfuncs {
		g.fn, g.nfuncs, g.locals, g.depth, g.code = i, nfuncs, 0, 0, nil
		g.stmts(8)
		// result: acc + param
		g.emit(0x23, 0, 0x20, 0, 0x6a, 0x0b)
		bodies = append(bodies, body(vec([]byte{byte(g.locals), 0x7f}), g.code...))
	}
	funcs := make([][]byte, nfuncs)
	elems := make([][]byte, nfuncs)
	for i := range funcs {
		funcs[i] = []byte{0}          // type 0
		elems[i] = leb(uint32(i + 1)) // table slot i holds f_i
	}
	return wasm(
		sec(1, vec(
			[]byte{0x60, 1, 0x7f, 1, 0x7f},       // 0: (i32) -> i32
			[]byte{0x60, 2, 0x7f, 0x7f, 1, 0x7f}, // 1: (i32 i32) -> i32, a loop type
		)),
		sec(2, vec(cat(str("env"), str("imp"), []byte{0, 0}))),
		sec(3, vec(funcs...)),
		sec(4, vec([]byte{0x70, 0, byte(nfuncs)})),
		sec(6, vec([]byte{0x7f, 1, 0x41, 0, 0x0b})),
		sec(7, vec(cat(str("run"), []byte{0, 1}), cat(str("acc"), []byte{3, 0}))),
		sec(9, vec(cat([]byte{0, 0x41, 0, 0x0b}, vec(elems...)))),
		sec(10, vec(bodies...)),
	), g.checked
}

type progGen struct {
	data   []byte
	fn     int // the function being generated
	nfuncs int
	locals int // i32 locals declared so far (after the parameter, local 0)
	depth  int // loop and block nesting
	code   []byte
	// checked is set when a loop or a call is generated: a function body with either gets
	// a fuel check at its entry.
	checked bool
}

func (g *progGen) byte() byte {
	if len(g.data) == 0 {
		return 0
	}
	b := g.data[0]
	g.data = g.data[1:]
	return b
}

func (g *progGen) emit(b ...byte) { g.code = append(g.code, b...) }

// addAcc adds the i32 on the stack to global acc.
func (g *progGen) addAcc() { g.emit(0x23, 0, 0x6a, 0x24, 0) }

func (g *progGen) stmts(max int) {
	n := int(g.byte()) % (max + 1)
	for range n {
		g.stmt()
	}
}

func (g *progGen) stmt() {
	nested := g.depth < 3 && g.locals < 100 // locals are encoded as one byte
	switch op := g.byte() % 11; {
	case op == 1 && nested: // counted loop
		l := g.newLocal()
		g.emit(0x41, 1+g.byte()%3, 0x21, l) // local.set $l (1..3)
		g.checked = true
		g.emit(0x03, 0x40) // loop
		g.nest(func() { g.stmts(3) })
		g.emit(0x20, l, 0x41, 1, 0x6b, 0x22, l, 0x0d, 0) // br_if 0 (--$l)
		g.emit(0x0b)
	case op == 2 && nested: // loop with parameters and a result
		l := g.newLocal()
		g.emit(0x23, 0, 0x41, 1+g.byte()%3) // acc, count
		g.checked = true
		g.emit(0x03, 1) // loop (param i32 i32) (result i32)
		g.emit(0x21, l) // count -> $l
		g.nest(func() { g.stmts(2) })
		g.emit(0x41, 3, 0x6a)                         // acc + 3
		g.emit(0x20, l, 0x41, 1, 0x6b, 0x22, l)       // (acc+3, --$l)
		g.emit(0x20, l, 0x0d, 0, 0x1a, 0x0b, 0x24, 0) // br_if 0; drop; end; acc = result
	case op == 3 && nested: // block left early by br_if
		g.emit(0x02, 0x40)
		g.nest(func() {
			g.stmts(2)
			g.emit(0x20, 0, 0x41, 1+g.byte()%4, 0x71, 0x0d, 0) // br_if 0 (param & c)
			g.stmts(2)
		})
		g.emit(0x0b)
	case op == 4 && nested: // if/else
		g.emit(0x20, 0, 0x41, 1+g.byte()%4, 0x71, 0x04, 0x40)
		g.nest(func() {
			g.stmts(2)
			g.emit(0x05)
			g.stmts(2)
		})
		g.emit(0x0b)
	case op == 5 && nested: // br_table into one of three nested blocks
		g.emit(0x02, 0x40, 0x02, 0x40, 0x02, 0x40)
		g.emit(0x20, 0, 0x41, 3, 0x70, 0x0e, 2, 0, 1, 2) // br_table 0 1 2 (param % 3)
		g.emit(0x0b, 0x41, 1)
		g.addAcc()
		g.emit(0x0b, 0x41, 2)
		g.addAcc()
		g.emit(0x0b)
	case op == 6 && g.fn+1 < g.nfuncs: // direct call of a later function
		g.checked = true
		g.emit(0x20, 0, 0x10, g.later()+1)
		g.addAcc()
	case op == 7 && g.fn+1 < g.nfuncs: // indirect call of a later function
		g.checked = true
		g.emit(0x20, 0, 0x41, g.later(), 0x11, 0, 0)
		g.addAcc()
	case op == 8 && g.fn+1 < g.nfuncs: // tail call of a later function, when param == c
		g.emit(0x20, 0, 0x41, g.byte()%8, 0x46, 0x04, 0x40)
		g.checked = true
		g.emit(0x20, 0, 0x41, 1, 0x6a, 0x12, g.later()+1, 0x0b)
	case op == 9: // early return, when param == c
		g.emit(0x20, 0, 0x41, g.byte()%8, 0x46, 0x04, 0x40, 0x23, 0, 0x0f, 0x0b)
	case op == 10: // call the import
		g.checked = true
		g.emit(0x20, 0, 0x10, 0)
		g.addAcc()
	default: // acc += c; param = param*3 + 1
		g.emit(0x41, g.byte()%64)
		g.addAcc()
		g.emit(0x20, 0, 0x41, 3, 0x6c, 0x41, 1, 0x6a, 0x21, 0)
	}
}

func (g *progGen) nest(f func()) {
	g.depth++
	f()
	g.depth--
}

func (g *progGen) newLocal() byte {
	g.locals++
	return byte(g.locals) // local 0 is the parameter
}

// later picks a defined function after the current one.
func (g *progGen) later() byte {
	return byte(g.fn + 1 + int(g.byte())%(g.nfuncs-g.fn-1))
}
