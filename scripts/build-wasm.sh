#!/usr/bin/env bash
# Rebuilds every guest WebAssembly fixture from source, deterministically:
#
#   <dir>/<name>/go/*.go     -> <dir>/<name>/<name>-go.wasm   (Go, GOOS=wasip1, c-shared)
#   <dir>/<name>/as/index.ts -> <dir>/<name>/<name>-as.wasm   (AssemblyScript)
#
# for <dir> in examples/wasm (the examples) and guest-sdk/testdata (the SDK conformance modules).
#
# Usage: scripts/build-wasm.sh [--out DIR]
#   --out DIR  write the fixtures under DIR (same relative paths) instead of in place;
#              scripts/check-wasm.sh uses it to compare fresh builds with the committed files.
#
# Byte-identical output needs the same compilers: Go $GO_VERSION (GOTOOLCHAIN selects it; the go
# command fetches it through the module proxy if the local go is another version) and the
# AssemblyScript compiler pinned by guest-sdk/assemblyscript/package-lock.json (installed with
# `npm ci` when node_modules is missing).
set -euo pipefail

GO_VERSION=go1.26.8

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$root
while [ $# -gt 0 ]; do
	case $1 in
	--out) out=$(mkdir -p "$2" && cd "$2" && pwd); shift 2 ;;
	-h | --help) sed -n '2,15p' "$0"; exit 0 ;;
	*) echo "build-wasm: unknown argument $1" >&2; exit 2 ;;
	esac
done
cd "$root"

# Go: a fixed toolchain and a fixed environment, so nothing from the caller's shell leaks into
# the binary (GOFLAGS, GOEXPERIMENT, GOWASM...). -trimpath drops local paths; -buildvcs=false
# the commit; -s -w the symbol table and DWARF.
go_build() { # package dir, output file
	env -u GOFLAGS -u GOEXPERIMENT -u GOWASM -u GODEBUG \
		GOTOOLCHAIN="$GO_VERSION" GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 \
		go build -buildmode=c-shared -trimpath -buildvcs=false -ldflags='-s -w' -o "$2" "./$1"
}

# AssemblyScript: the SDK's pinned compiler, run from the repository root so that the file
# names compiled into abort messages are repository-relative.
sdk=guest-sdk/assemblyscript
if [ ! -x "$sdk/node_modules/.bin/asc" ]; then
	echo "build-wasm: installing the pinned AssemblyScript compiler (npm ci in $sdk)" >&2
	(cd "$sdk" && npm ci --no-audit --no-fund --loglevel=error)
fi
asc_flags=(-O3 --noAssert --runtime minimal --exportStart _initialize
	--use "abort=$sdk/assembly/runtime/clinkAbort"
	--use "trace=$sdk/assembly/runtime/clinkTrace"
	--use "seed=$sdk/assembly/runtime/clinkSeed")
as_build() { # entry file, output file
	"$sdk/node_modules/.bin/asc" "$1" -o "$2" "${asc_flags[@]}"
}

built=0
for dir in examples/wasm/*/ guest-sdk/testdata/*/; do
	dir=${dir%/}
	name=$(basename "$dir")
	mkdir -p "$out/$dir"
	if [ -f "$dir/go/main.go" ]; then
		go_build "$dir/go" "$out/$dir/$name-go.wasm"
		echo "built $dir/$name-go.wasm"
		built=$((built + 1))
	fi
	if [ -f "$dir/as/index.ts" ]; then
		as_build "$dir/as/index.ts" "$out/$dir/$name-as.wasm"
		echo "built $dir/$name-as.wasm"
		built=$((built + 1))
	fi
done
echo "build-wasm: $built modules"
