// sdknoop is a probe guest for BenchmarkGoGuest (host/abi/hotpath_test.go).
package main

import (
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/jsonx"
)

var counts = clink.NewState("count", clink.Prefetch())
var out []byte
var _ = jsonx.AppendInt

func init() { clink.Register("sdknoop", clink.ProcessFunc(process)) }

func process(r *clink.Record) error {
	return nil
}

func main() {}
