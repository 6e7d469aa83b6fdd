// Command counter is a clink-wasm operator that counts records per key and emits
// {"key":K,"count":N} for every record.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o counter-go.wasm .
package main

import (
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/jsonx"
)

// counts holds one int64 per record key, under the empty entry. Prefetched: the host delivers
// it with each record and takes it back written, so the read-modify-write makes no import call.
var counts = clink.NewState("count", clink.Prefetch())

// out is the output buffer, reused for every record.
var out []byte

func init() { clink.Register("counter", clink.ProcessFunc(process)) }

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
	return clink.Emit(r.Key, out)
}

func main() {}
