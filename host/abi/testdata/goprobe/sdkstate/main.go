// sdkstate is a probe guest for BenchmarkGoGuest (host/abi/hotpath_test.go).
package main

import (
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/jsonx"
)

var counts = clink.NewState("count", clink.Prefetch())
var out []byte
var _ = jsonx.AppendInt

func init() { clink.Register("sdkstate", clink.ProcessFunc(process)) }

func process(r *clink.Record) error {
	n, _, err := counts.GetInt64(nil)
	if err != nil {
		return err
	}
	return counts.PutInt64(nil, n+1)
}

func main() {}
