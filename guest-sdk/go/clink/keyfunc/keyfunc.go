// Package keyfunc lets a clink operator key its own records (docs/abi.md, "clink_key").
//
// Importing it adds the clink_key export to the module, so only operators that have a key
// function import it. Set the function from an init function:
//
//	var key []byte
//
//	func init() {
//		keyfunc.Set(func(value []byte) ([]byte, bool) {
//			raw, ok := jsonx.Field(value, "user") // raw JSON: "alice", quotes included
//			if !ok {
//				return nil, false
//			}
//			key, ok = jsonx.AppendUnquote(key[:0], raw)
//			return key, ok
//		})
//	}
//
// The function must be pure: the host allows no import inside it (no state, no log). It
// returns the key bytes, which may point into value, or ok=false to reject the record as
// malformed. A panic also rejects the record.
package keyfunc

import "github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"

// Func computes a record's key from its value.
type Func func(value []byte) (key []byte, ok bool)

// Set installs f as the module's key function. Call it from an init function.
func Set(f Func) { abi.KeyFunc = f }

// compute runs the key function over the value the host wrote to the input buffer.
func compute(valueLen uint32) (key []byte, ok bool) {
	defer func() {
		if recover() != nil {
			key, ok = nil, false
		}
	}()
	if abi.KeyFunc == nil {
		return nil, false
	}
	return abi.KeyFunc(abi.Input[:valueLen:valueLen])
}
