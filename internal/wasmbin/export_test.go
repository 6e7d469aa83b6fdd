package wasmbin_test

import (
	"context"
	"errors"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/tetratelabs/wazero/api"

	"github.com/clink-wasm/clink-wasm/internal/wasmbin"
)

// TestFuelExport: the rewritten module exports $fuel, with or without an export section of its
// own, and a host that sets it to 0 from another goroutine makes the next check call the fuel
// import. That is how the host's watchdog reaches a call whose refill would last too long.
func TestFuelExport(t *testing.T) {
	ctx := context.Background()
	t.Run("no export section", func(t *testing.T) {
		mod := instantiate(t, instrument(t, oneFunc(0x0b)), &fuel{refill: 1})
		g, ok := mod.ExportedGlobal(wasmbin.FuelExportName).(api.MutableGlobal)
		if !ok || g.Type() != api.ValueTypeI32 || g.Get() != 0 {
			t.Fatalf("%s is not exported as a mutable i32 starting at 0", wasmbin.FuelExportName)
		}
	})
	t.Run("stops a long refill", func(t *testing.T) {
		// spin counts its iterations in the exported global n, forever.
		bin := wasm(
			sec(1, vec([]byte{0x60, 0, 0})),
			sec(3, vec([]byte{0})),
			sec(6, vec([]byte{0x7e, 0x01, 0x42, 0x00, 0x0b})), // (global $n (mut i64) (i64.const 0))
			sec(7, vec(cat(str("n"), []byte{3, 0}), cat(str("spin"), []byte{0, 0}))),
			sec(10, vec(body(noLocals,
				0x03, 0x40, // loop
				0x23, 0x00, 0x42, 0x01, 0x7c, 0x24, 0x00, // n = n + 1
				0x0c, 0x00, 0x0b, 0x0b))), // br 0; end; end
		)
		started := make(chan struct{})
		calls := 0
		const refill = 1 << 30
		f := &fuel{refill: refill, check: func(context.Context) error {
			calls++
			if calls == 1 {
				close(started)
				return nil
			}
			return errOutOfFuel
		}}
		mod := instantiate(t, instrument(t, bin), f)
		g := mod.ExportedGlobal(wasmbin.FuelExportName).(api.MutableGlobal)
		// No collection during the spin: a stop-the-world waits for the spinning call, which
		// compiled code cannot be preempted out of, and stops this goroutine's Sets meanwhile,
		// so the call would run its whole refill (in production that is the bound: the next
		// check comes at the refill's end). That is the runtime's doing, not the fuel's.
		runtime.GC()
		defer debug.SetGCPercent(debug.SetGCPercent(-1))
		done := make(chan error, 1)
		go func() {
			_, err := mod.ExportedFunction("spin").Call(ctx)
			done <- err
		}()
		<-started
		// The guest overwrites a 0 that lands while the import is returning its refill, or
		// between the load and the store of its decrement, so the host sets it until the
		// call stops, as the watchdog does at every tick.
		var err error
	wait:
		for {
			select {
			case err = <-done:
				break wait
			default:
				g.Set(0)
				runtime.Gosched()
			}
		}
		if !errors.Is(err, errOutOfFuel) {
			t.Fatalf("spin returned %v, want errOutOfFuel", err)
		}
		// Without the Set the second check comes after a whole refill of iterations.
		if n := mod.ExportedGlobal("n").Get(); n >= refill/2 {
			t.Fatalf("the loop ran %d iterations after $fuel was set to 0", n)
		}
	})
}

// TestLeafFunctionsHaveNoEntryCheck: a function with neither a loop nor a call cannot run
// unboundedly, so it gets no check; one that calls keeps its entry check.
func TestLeafFunctionsHaveNoEntryCheck(t *testing.T) {
	ctx := context.Background()
	bin := wasm(
		sec(1, vec([]byte{0x60, 0, 1, 0x7f})), // () -> i32
		sec(3, vec([]byte{0}, []byte{0})),     // leaf, caller
		sec(7, vec(cat(str("leaf"), []byte{0, 0}), cat(str("caller"), []byte{0, 1}))),
		sec(10, vec(
			body(noLocals, 0x41, 0x07, 0x0b), // leaf: i32.const 7
			body(noLocals, 0x10, 0x00, 0x0b), // caller: call leaf
		)),
	)
	f := &fuel{refill: 1} // every check calls the import
	mod := instantiate(t, instrument(t, bin), f)
	for range 5 {
		if res, err := callExport(ctx, mod, "leaf"); err != nil || res[0] != 7 {
			t.Fatalf("leaf() = %v, %v", res, err)
		}
	}
	if f.calls != 0 {
		t.Fatalf("5 calls of a leaf function made %d fuel checks, want 0", f.calls)
	}
	for range 3 {
		if res, err := callExport(ctx, mod, "caller"); err != nil || res[0] != 7 {
			t.Fatalf("caller() = %v, %v", res, err)
		}
	}
	if f.calls != 3 {
		t.Fatalf("3 calls of a calling function made %d fuel checks, want 3", f.calls)
	}
}
