#!/bin/sh
# gen.sh rebuilds the committed .wasm fixtures from their sources.
# Run it through `go generate ./internal/wasmbin/` or directly from anywhere.
#
# Needs wat2wasm (wabt) on PATH; exceptions.wat needs try_table, which wabt
# supports from 1.0.37, so it is built with the npm build of wabt. asguest is
# built with the AssemblyScript compiler from npm. goguest is built with the Go
# toolchain and committed gzipped (it is 2.6 MB).
set -eu
cd "$(dirname "$0")"

WAT2WASM=${WAT2WASM:-wat2wasm}

for f in empty memonly arith env elems loops simd bulk; do
	"$WAT2WASM" "$f.wat" -o "$f.wasm"
done
"$WAT2WASM" --debug-names calls.wat -o calls.wasm
"$WAT2WASM" --enable-threads atomics.wat -o atomics.wasm
"$WAT2WASM" --enable-tail-call tailcall.wat -o tailcall.wasm
npx -y -p wabt@1.0.39 wat2wasm --enable-all exceptions.wat -o exceptions.wasm
npx -y -p assemblyscript@0.28.20 asc asguest/index.ts -o asguest.wasm -O3 --use abort=

GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -o goguest.wasm ./goguest/main.go
gzip -9 -n -f goguest.wasm
