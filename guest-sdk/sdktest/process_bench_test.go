package sdktest

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// BenchmarkProcess measures the guest side of one counter record: clink_process with its
// get_async, put and emit served by the leanest host possible (a map, no checks, emit
// discarded), so that what differs between the modules is the code the SDKs generate. The
// baseline is host/abi/testdata/counter.wasm, a hand-written WAT counter (which emits
// {"count":N} without the key).
func BenchmarkProcess(b *testing.B) {
	for _, tc := range []struct{ name, path string }{
		{"wat", "../../host/abi/testdata/counter.wasm"},
		{"as", examplesDir + "/counter/counter-as.wasm"},
		{"go", examplesDir + "/counter/counter-go.wasm"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			bin, err := os.ReadFile(tc.path)
			if err != nil {
				b.Skip(err)
			}
			ctx := context.Background()
			rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
			defer rt.Close(ctx)
			wasi_snapshot_preview1.MustInstantiate(ctx, rt)
			state := map[string][]byte{}
			var key string
			i32 := api.ValueTypeI32
			hb := rt.NewHostModuleBuilder("clink_v1")
			fn := func(name string, params, results []api.ValueType, f api.GoModuleFunc) {
				hb.NewFunctionBuilder().WithGoModuleFunction(f, params, results).Export(name)
			}
			fn("get_async", []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i32}, func(_ context.Context, m api.Module, s []uint64) {
				v, ok := state[key]
				if !ok {
					s[0] = api.EncodeI32(-1)
					return
				}
				m.Memory().Write(uint32(s[3]), v)
				s[0] = uint64(len(v))
			})
			fn("put", []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i32}, func(_ context.Context, m api.Module, s []uint64) {
				v, _ := m.Memory().Read(uint32(s[3]), uint32(s[4]))
				state[key] = append(state[key][:0], v...)
				s[0] = 0
			})
			fn("emit", []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}, func(_ context.Context, m api.Module, s []uint64) { s[0] = 0 })
			fn("take_result", []api.ValueType{i32, i32}, []api.ValueType{i32}, func(_ context.Context, m api.Module, s []uint64) { s[0] = api.EncodeI32(-6) })
			fn("log", []api.ValueType{i32, i32, i32}, nil, func(_ context.Context, m api.Module, s []uint64) {})
			if _, err := hb.Instantiate(ctx); err != nil {
				b.Fatal(err)
			}
			mod, err := rt.InstantiateWithConfig(ctx, bin, moduleConfig())
			if err != nil {
				b.Fatal(err)
			}
			keys := make([]string, 1000)
			for i := range keys {
				keys[i] = "user-" + strconv.Itoa(i)
			}
			value := []byte(`{"user":"user-000","page":"/checkout","n":12345}`)
			ptr, err := mod.ExportedFunction("clink_input").Call(ctx, 256)
			if err != nil {
				b.Fatal(err)
			}
			process := mod.ExportedFunction("clink_process")
			stack := make([]uint64, 3)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				key = keys[i%len(keys)]
				mod.Memory().WriteString(uint32(ptr[0]), key)
				mod.Memory().Write(uint32(ptr[0])+uint32(len(key)), value)
				stack[0], stack[1], stack[2] = uint64(len(key)), uint64(len(value)), 0
				if err := process.CallWithStack(ctx, stack); err != nil || stack[0] != 0 {
					b.Fatal(err, stack[0])
				}
			}
		})
	}
}
