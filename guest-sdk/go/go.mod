module github.com/clink-wasm/clink-wasm/guest-sdk/go

go 1.24
