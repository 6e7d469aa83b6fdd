// Command dedup is a clink-wasm operator that emits the first record of every key unchanged and
// drops the later ones.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o dedup-go.wasm .
package main

import "github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"

// seen holds an empty value for every key already emitted. Prefetched: the host delivers it
// with each record, so checking and marking a key makes no import call.
var seen = clink.NewState("seen", clink.Prefetch())

func init() { clink.Register("dedup", clink.ProcessFunc(process)) }

func process(r *clink.Record) error {
	_, found, err := seen.Get(nil)
	if err != nil || found {
		return err
	}
	if err := seen.Put(nil, nil); err != nil {
		return err
	}
	return clink.Emit(r.Key, r.Value)
}

func main() {}
