// Command goguest is a tiny Go program built as a WASI reactor
// (GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared) to test the rewrite
// on real Go toolchain output. See ../gen.sh.
package main

import (
	"fmt"
	"sort"
	"strings"
)

// sum returns 1 + 2 + ... + n with a plain loop.
//
//go:wasmexport sum
func sum(n int32) int64 {
	var s int64
	for i := int32(1); i <= n; i++ {
		s += int64(i)
	}
	return s
}

// work exercises the runtime: allocation, maps, sorting, fmt, goroutines and
// channels. It returns a checksum that depends on all of them.
//
//go:wasmexport work
func work(n int32) int32 {
	m := make(map[string]int, n)
	for i := range int(n) {
		m[fmt.Sprintf("k%03d", i%97)] += i
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	ch := make(chan int)
	go func() {
		defer close(ch)
		for _, k := range keys {
			ch <- m[k] * len(k)
		}
	}()
	sum := 0
	for v := range ch {
		sum = sum*31 + v
	}
	return int32(sum) ^ int32(len(strings.Join(keys, ",")))
}

// spin never returns: the fuel check must stop it.
//
//go:wasmexport spin
func spin() {
	for i := 0; ; i++ {
		_ = i
	}
}

func main() {}
