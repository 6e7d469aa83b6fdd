//go:build !wasip1

package main

import (
	"flag"
	"testing"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/clinktest"
)

var update = flag.Bool("update", false, "rewrite ../expected.jsonl from the output")

// TestExpected runs the operator natively over ../input.jsonl and compares with
// ../expected.jsonl. The same files check the built .wasm modules through the host.
func TestExpected(t *testing.T) {
	clinktest.CheckGolden(t, "..", "user", *update)
}
