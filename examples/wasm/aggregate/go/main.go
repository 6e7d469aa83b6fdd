// Command aggregate is a clink-wasm operator that keeps a running count, sum, min and max of the
// integer field "value" per key and emits {"key":K,"count":N,"sum":S,"min":MIN,"max":MAX} for
// every record it aggregates.
//
// A record whose "value" is missing or not a JSON integer within int64 is skipped with a
// warning in the operator log. A sum that would overflow int64 fails the record.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o aggregate-go.wasm .
package main

import (
	"errors"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/jsonx"
)

// aggs holds, per record key, count, sum, min and max as four little-endian int64s. Prefetched:
// delivered with each record and written back by the host, with no import call.
var aggs = clink.NewState("agg", clink.Prefetch())

var (
	buf [32]byte
	out []byte
)

func init() { clink.Register("aggregate", clink.ProcessFunc(process)) }

func process(r *clink.Record) error {
	v, ok := jsonx.FieldInt(r.Value, "value")
	if !ok {
		clink.Log(clink.LevelWarn, `skipping a record whose "value" is not an integer`)
		return nil
	}
	got, found, err := aggs.AppendGet(buf[:0], nil)
	if err != nil {
		return err
	}
	var count, sum, lo, hi int64
	switch {
	case !found:
		count, sum, lo, hi = 1, v, v, v
	case len(got) != 32:
		return errors.New("aggregate: corrupt state (want 32 bytes)")
	default:
		count = clink.Int64(got[0:]) + 1
		sum = clink.Int64(got[8:])
		lo = min(clink.Int64(got[16:]), v)
		hi = max(clink.Int64(got[24:]), v)
		if (v > 0 && sum > 1<<63-1-v) || (v < 0 && sum < -1<<63-v) {
			return errors.New("aggregate: sum overflows int64")
		}
		sum += v
	}
	clink.PutInt64(buf[0:], count)
	clink.PutInt64(buf[8:], sum)
	clink.PutInt64(buf[16:], lo)
	clink.PutInt64(buf[24:], hi)
	if err := aggs.Put(nil, buf[:]); err != nil {
		return err
	}

	out = append(out[:0], `{"key":`...)
	out = jsonx.AppendString(out, r.Key)
	out = append(out, `,"count":`...)
	out = jsonx.AppendInt(out, count)
	out = append(out, `,"sum":`...)
	out = jsonx.AppendInt(out, sum)
	out = append(out, `,"min":`...)
	out = jsonx.AppendInt(out, lo)
	out = append(out, `,"max":`...)
	out = jsonx.AppendInt(out, hi)
	out = append(out, '}')
	return clink.Emit(r.Key, out)
}

func main() {}
