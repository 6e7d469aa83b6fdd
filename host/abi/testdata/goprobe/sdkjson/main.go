// sdkjson is a probe guest for BenchmarkGoGuest (host/abi/hotpath_test.go).
package main

import (
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/jsonx"
)

var counts = clink.NewState("count", clink.Prefetch())
var out []byte
var _ = jsonx.AppendInt

func init() { clink.Register("sdkjson", clink.ProcessFunc(process)) }

func process(r *clink.Record) error {
	n, _, err := counts.GetInt64(nil)
	if err != nil {
		return err
	}
	n++
	if err := counts.PutInt64(nil, n); err != nil {
		return err
	}
	out = append(out[:0], `{"key":`...)
	out = jsonx.AppendString(out, r.Key)
	out = append(out, `,"count":`...)
	out = jsonx.AppendInt(out, n)
	out = append(out, '}')
	return nil
}

func main() {}
