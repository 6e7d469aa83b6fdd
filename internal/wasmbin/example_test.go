package wasmbin_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/clink-wasm/clink-wasm/internal/wasmbin"
)

// This example instruments a module and provides the fuel import with a
// time limit: a call that runs past it is stopped at the next fuel check.
func ExampleInstrument() {
	ctx := context.Background()
	bin, err := os.ReadFile("testdata/loops.wasm")
	if err != nil {
		log.Fatal(err)
	}
	bin, err = wasmbin.Instrument(bin)
	if err != nil {
		log.Fatal(err)
	}

	r := wazero.NewRuntime(ctx)
	defer r.Close(ctx)

	errTimeLimit := errors.New("time limit exceeded")
	var deadline time.Time
	_, err = r.NewHostModuleBuilder(wasmbin.FuelImportModule).
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
			if err := ctx.Err(); err != nil {
				panic(err) // wazero turns the panic into an error of the call
			}
			if time.Now().After(deadline) {
				panic(errTimeLimit)
			}
			stack[0] = 1 << 20 // checks until the next call of this function
		}), nil, []api.ValueType{api.ValueTypeI32}).
		Export(wasmbin.FuelImportName).
		Instantiate(ctx)
	if err != nil {
		log.Fatal(err)
	}
	mod, err := r.Instantiate(ctx, bin)
	if err != nil {
		log.Fatal(err)
	}

	deadline = time.Now().Add(50 * time.Millisecond)
	res, err := mod.ExportedFunction("count").Call(ctx, 1000)
	fmt.Println(res, err)

	deadline = time.Now().Add(50 * time.Millisecond)
	_, err = mod.ExportedFunction("spin").Call(ctx) // loops forever
	fmt.Println(errors.Is(err, errTimeLimit))
	// Output:
	// [1000] <nil>
	// true
}
