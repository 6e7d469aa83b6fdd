#!/usr/bin/env bash
# Rebuilds every guest WebAssembly fixture from source, deterministically:
#
#   <dir>/<name>/go/*.go     -> <dir>/<name>/<name>-go.wasm   (Go, GOOS=wasip1, c-shared)
#   <dir>/<name>/as/index.ts -> <dir>/<name>/<name>-as.wasm   (AssemblyScript)
#   <dir>/<name>/c/main.c    -> <dir>/<name>/<name>-c.wasm    (C, clang + wasi-libc, reactor)
#   <dir>/<name>/cpp/main.cpp -> <dir>/<name>/<name>-cpp.wasm (C++, the same header)
#   <dir>/<name>/rust/lib.rs -> <dir>/<name>/<name>-rust.wasm (Rust, rustc cdylib)
#
# for <dir> in examples/wasm (the examples) and guest-sdk/testdata (the SDK conformance modules).
#
# Usage: scripts/build-wasm.sh [--out DIR]
#   --out DIR  write the fixtures under DIR (same relative paths) instead of in place;
#              scripts/check-wasm.sh uses it to compare fresh builds with the committed files.
#
# Byte-identical output needs the same compilers: Go $GO_VERSION (GOTOOLCHAIN selects it; the go
# command fetches it through the module proxy if the local go is another version) and the
# AssemblyScript compiler pinned by guest-sdk/assemblyscript/package-lock.json, with its binaryen
# (wasm-opt, which post-optimises the AssemblyScript modules; installed with `npm ci` when
# node_modules is missing), Debian 12's clang 14 with wasi-libc (packages clang lld
# wasi-libc libclang-rt-14-dev-wasm32) and Debian 12's rustc 1.63 with libstd-rust-dev-wasm32.
# The C and Rust builds call /usr/bin/clang and /usr/bin/rustc by path, so that a rustup or
# other toolchain earlier on PATH cannot change the bytes.
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
# A default.pgo in the package directory is used (-pgo=auto): see guest-sdk/go/README.md,
# "Profile-guided optimisation". (wasm_opt below would take another 5-9% off a Go module's CPU
# per record, but costs ~15 s a module, 6 modules here, so the Go fixtures do not use it.)
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
	wasm_opt "$2"
}

# wasm-opt (binaryen, pinned with the AssemblyScript compiler): one more -O3 pass over asc's
# output, with larger functions inlined. After asc's own passes it inlines emit and
# appendJsonString into clink_process: the AssemblyScript counter's CPU per record in the host
# fell by ~5% (docs/BENCHMARKS.md, "Issue 11, session 8"). The features are the ones the
# compilers emit; a module using another fails validation here rather than build differently.
wasm_opt() { # file, optimised in place
	"$sdk/node_modules/.bin/wasm-opt" --enable-bulk-memory --enable-sign-ext --enable-mutable-globals \
		--enable-nontrapping-float-to-int -O3 --flexible-inline-max-function-size 100 \
		--inline-functions-with-loops -o "$1" "$1"
}

# C and C++: the header-only SDK in guest-sdk/c; a reactor (-mexec-model=reactor links
# crt1-reactor.o, which exports _initialize); no debug sections (they hold build paths).
CLANG=${CLANG:-/usr/bin/clang}
c_flags=(--target=wasm32-wasi -O2 -Wall -Wextra -Werror -mexec-model=reactor -Wl,--strip-debug
	-I guest-sdk/c)
c_build() { # source file, output file
	case $1 in
	*.cpp) "$CLANG++" "${c_flags[@]}" -std=c++17 -fno-exceptions -nostdlib++ -o "$2" "$1" ;;
	*) "$CLANG" "${c_flags[@]}" -std=c11 -o "$2" "$1" ;;
	esac
}

# Rust: the SDK crate guest-sdk/rust, compiled by rustc directly (no cargo, no registry), then
# the operator as a cdylib against it. Rust 1.63 links no reactor start file for a cdylib, so
# crt1-reactor.o from the target's self-contained directory is linked in (docs/abi.md,
# "Building a reactor"); without it, wasm-ld wraps every export in constructor calls. The stack
# is 64 KiB, clang's default, instead of rustc's 1 MiB: every in-flight record holds an
# instance, so linear memory per instance is what bounds how many can wait at once.
RUSTC=${RUSTC:-/usr/bin/rustc}
rust_flags=(--edition 2021 --target wasm32-wasi -C opt-level=2 -C strip=debuginfo
	-C codegen-units=1 --remap-path-prefix "$root=.")
rust_sdk=""
rust_build() { # source file, output file
	if [ -z "$rust_sdk" ]; then
		rust_sdk=$(mktemp -d)
		trap 'rm -rf "$rust_sdk"' EXIT
		"$RUSTC" "${rust_flags[@]}" --crate-type rlib --crate-name clink \
			-o "$rust_sdk/libclink.rlib" guest-sdk/rust/src/lib.rs
	fi
	local sysroot
	sysroot=$("$RUSTC" --print sysroot)
	"$RUSTC" "${rust_flags[@]}" --crate-type cdylib --crate-name "$(basename "${2%.wasm}" | tr - _)" \
		--extern clink="$rust_sdk/libclink.rlib" \
		-C link-arg="$sysroot/lib/rustlib/wasm32-wasi/lib/self-contained/crt1-reactor.o" \
		-C link-arg=-zstack-size=65536 \
		-o "$2" "$1"
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
	for lang in c cpp; do
		src=$dir/$lang/main.$lang
		if [ -f "$src" ]; then
			c_build "$src" "$out/$dir/$name-$lang.wasm"
			echo "built $dir/$name-$lang.wasm"
			built=$((built + 1))
		fi
	done
	if [ -f "$dir/rust/lib.rs" ]; then
		rust_build "$dir/rust/lib.rs" "$out/$dir/$name-rust.wasm"
		echo "built $dir/$name-rust.wasm"
		built=$((built + 1))
	fi
done
echo "build-wasm: $built modules"
