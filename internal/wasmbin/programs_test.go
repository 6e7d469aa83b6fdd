package wasmbin_test

import (
	"context"
	"errors"
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
// br_table, early returns, direct, indirect and tail calls of later functions,
// the same calls back to earlier functions or the function itself, an
// import), runs it before and after instrumentation, and requires the same
// results. The fuel import refills only a few units at a time, so it runs
// throughout. Calls back make cycles in the call graph, which the entry checks
// must cover: the program is run once more, instrumented, with calls back
// allowed far more often than the fuel lasts, and must be stopped by the fuel
// before that allowance runs out.
//
// Run it with: go test ./internal/wasmbin/ -run '^$' -fuzz FuzzInstrumentPrograms
func FuzzInstrumentPrograms(f *testing.F) {
	for _, seed := range []string{
		"", "\x02\x03\x01\x05\x02\x07\x04\x09",
		"\x02\x01\x01\x01\x01\x06\x02\x04\x03\x07\x05\x00\x08\x03",
		"\x01\x04\x06\x06\x06\x01\x01\x01\x07\x03\x02\x09\x05\x0a",
		// Calls back: f1 calls itself, f2 calls f0 indirectly and f1 by a tail call.
		"\x02\x03\x02\x06\x00\x00\x02\x0b\x00\x02\x0c\x00\x0d\x00",
		"\x02\x02\x03\x0b\x00\x06\x00\x03\x0d\x00\x0c\x00\x0b\x01",
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
	instantiate := func(t *testing.T, bin []byte) api.Module {
		mod, err := r.InstantiateWithConfig(ctx, bin,
			wazero.NewModuleConfig().WithName(fmt.Sprint("p", seq.Add(1))))
		if err != nil {
			t.Fatalf("%v\nmodule: % x", err, bin)
		}
		return mod
	}
	args := []uint64{0, 1, 6, 7}
	f.Fuzz(func(t *testing.T, data []byte) {
		bin, leaves := genProgram(data)
		out, err := wasmbin.Instrument(bin)
		if err != nil {
			t.Fatal(err)
		}
		var heads uint64 // loop iterations, each passing a check
		run := func(bin []byte) []uint64 {
			mod := instantiate(t, bin)
			defer mod.Close(ctx)
			var res []uint64
			for _, arg := range args {
				mod.ExportedGlobal("budget").(api.MutableGlobal).Set(callsBack)
				v, err := mod.ExportedFunction("run").Call(ctx, arg)
				if err != nil {
					t.Fatal(err)
				}
				res = append(res, v[0]&0xffffffff, mod.ExportedGlobal("acc").Get()&0xffffffff)
			}
			heads = mod.ExportedGlobal("heads").Get() & 0xffffffff
			return res
		}
		fl.refill, fl.limit = 1, 0
		if len(data) > 0 {
			fl.refill = 1 + int32(data[0]%5)
		}
		want := run(bin)
		fl.calls = 0
		got := run(out)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("instrumented results %v, original %v\nmodule: % x", got, want, bin)
		}
		// Every loop header has a check, and a refill lasts fl.refill checks.
		if checks := uint64(fl.calls) * uint64(fl.refill); checks < heads {
			t.Fatalf("%d loop iterations, at most %d checks", heads, checks)
		}
		// A program without loops and calls is made of leaf functions, without checks.
		if leaves && fl.calls != 0 {
			t.Fatalf("the fuel import was called %d times by a program of leaf functions", fl.calls)
		}

		// Calls back allowed far more often than the fuel lasts: a cycle of calls without
		// a check would use up the allowance (a cycle of tail calls) or the stack (the
		// others) before the fuel ran out.
		fl.calls, fl.limit = 0, 10
		mod := instantiate(t, out)
		defer mod.Close(ctx)
		budget := mod.ExportedGlobal("budget").(api.MutableGlobal)
		for _, arg := range args {
			budget.Set(runawayCallsBack)
			_, err := mod.ExportedFunction("run").Call(ctx, arg)
			if err != nil && !errors.Is(err, errOutOfFuel) {
				t.Fatalf("got %v, want %v or none\nmodule: % x", err, errOutOfFuel, bin)
			}
			if left := budget.Get() & 0xffffffff; left == 0 {
				t.Fatalf("%d calls back ran on at most %d checks\nmodule: % x",
					runawayCallsBack, fl.calls*int(fl.refill), bin)
			}
			if err != nil {
				break // out of fuel for good
			}
		}
	})
}

// How many calls back a program may make per call of run: a few in the runs compared, and
// far more than the checks of fl.limit refills allow in the runaway run (every call enters a
// function that calls, so it passes a check, or a leaf).
const (
	callsBack        = 5
	runawayCallsBack = 1 << 20
)

// genProgram decodes data into a module exporting run: (i32) -> i32 and the
// mutable globals acc, budget and heads. Functions are f0 (run) ... fn-1, all
// (i32) -> i32. f_i calls f_j for j > i freely, and f_j for j <= i (a call
// back) only while budget, which the caller sets, is above 0, decrementing
// it; loops count down locals of their own and run at most 3 times, adding
// their iterations to heads. So every program terminates. leaves reports
// whether the program has neither a loop nor a call.
func genProgram(data []byte) (bin []byte, leaves bool) {
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
	mutI32 := []byte{0x7f, 1, 0x41, 0, 0x0b}
	return wasm(
		sec(1, vec(
			[]byte{0x60, 1, 0x7f, 1, 0x7f},       // 0: (i32) -> i32
			[]byte{0x60, 2, 0x7f, 0x7f, 1, 0x7f}, // 1: (i32 i32) -> i32, a loop type
		)),
		sec(2, vec(cat(str("env"), str("imp"), []byte{0, 0}))),
		sec(3, vec(funcs...)),
		sec(4, vec([]byte{0x70, 0, byte(nfuncs)})),
		sec(6, vec(mutI32, mutI32, mutI32)),
		sec(7, vec(cat(str("run"), []byte{0, 1}), cat(str("acc"), []byte{3, 0}),
			cat(str("budget"), []byte{3, 1}), cat(str("heads"), []byte{3, 2}))),
		sec(9, vec(cat([]byte{0, 0x41, 0, 0x0b}, vec(elems...)))),
		sec(10, vec(bodies...)),
	), !g.loopsOrCalls
}

type progGen struct {
	data   []byte
	fn     int // the function being generated
	nfuncs int
	locals int // i32 locals declared so far (after the parameter, local 0)
	depth  int // loop and block nesting
	code   []byte
	// loopsOrCalls is set when a loop or a call is generated.
	loopsOrCalls bool
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
	switch op := g.byte() % 14; {
	case op == 1 && nested: // counted loop
		l := g.newLocal()
		g.emit(0x41, 1+g.byte()%3, 0x21, l) // local.set $l (1..3)
		g.emit(0x03, 0x40)                  // loop
		g.countHead()
		g.nest(func() { g.stmts(3) })
		g.emit(0x20, l, 0x41, 1, 0x6b, 0x22, l, 0x0d, 0) // br_if 0 (--$l)
		g.emit(0x0b)
	case op == 2 && nested: // loop with parameters and a result
		l := g.newLocal()
		g.emit(0x23, 0, 0x41, 1+g.byte()%3) // acc, count
		g.emit(0x03, 1)                     // loop (param i32 i32) (result i32)
		g.emit(0x21, l)                     // count -> $l
		g.countHead()
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
		g.call(g.later())
	case op == 7 && g.fn+1 < g.nfuncs: // indirect call of a later function
		g.callIndirect(g.later())
	case op == 8 && g.fn+1 < g.nfuncs: // tail call of a later function, when param == c
		g.emit(0x20, 0, 0x41, g.byte()%8, 0x46, 0x04, 0x40)
		g.tailCall(g.later())
		g.emit(0x0b)
	case op == 9: // early return, when param == c
		g.emit(0x20, 0, 0x41, g.byte()%8, 0x46, 0x04, 0x40, 0x23, 0, 0x0f, 0x0b)
	case op == 10: // call the import
		g.loopsOrCalls = true
		g.emit(0x20, 0, 0x10, 0)
		g.addAcc()
	case op == 11: // direct call back
		g.callBack(func() { g.call(g.earlier()) })
	case op == 12: // indirect call back
		g.callBack(func() { g.callIndirect(g.earlier()) })
	case op == 13: // tail call back
		g.callBack(func() { g.tailCall(g.earlier()) })
	default: // acc += c; param = param*3 + 1
		g.emit(0x41, g.byte()%64)
		g.addAcc()
		g.emit(0x20, 0, 0x41, 3, 0x6c, 0x41, 1, 0x6a, 0x21, 0)
	}
}

// countHead adds 1 to global heads, at the start of a loop's body.
func (g *progGen) countHead() {
	g.loopsOrCalls = true
	g.emit(0x23, 2, 0x41, 1, 0x6a, 0x24, 2)
}

// call calls f_j with param and adds the result to acc.
func (g *progGen) call(j byte) {
	g.loopsOrCalls = true
	g.emit(0x20, 0, 0x10, j+1)
	g.addAcc()
}

// callIndirect calls f_j through the table with param and adds the result to acc.
func (g *progGen) callIndirect(j byte) {
	g.loopsOrCalls = true
	g.emit(0x20, 0, 0x41, j, 0x11, 0, 0)
	g.addAcc()
}

// tailCall returns f_j(param+1).
func (g *progGen) tailCall(j byte) {
	g.loopsOrCalls = true
	g.emit(0x20, 0, 0x41, 1, 0x6a, 0x12, j+1)
}

// callBack runs call if budget is above 0, decrementing it first.
func (g *progGen) callBack(call func()) {
	g.emit(0x23, 1, 0x41, 0, 0x4a, 0x04, 0x40) // if budget > 0
	g.emit(0x23, 1, 0x41, 1, 0x6b, 0x24, 1)    // budget--
	call()
	g.emit(0x0b)
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

// earlier picks a defined function up to the current one.
func (g *progGen) earlier() byte { return byte(int(g.byte()) % (g.fn + 1)) }

// later picks a defined function after the current one.
func (g *progGen) later() byte {
	return byte(g.fn + 1 + int(g.byte())%(g.nfuncs-g.fn-1))
}
