// Package clink is the Go SDK for clink-wasm operators: keyed stream-processing functions
// compiled to WebAssembly and run by the clink-wasm host through guest ABI v1
// (docs/abi.md in the clink-wasm repository).
//
// An operator is a Go package main built as a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o counter.wasm .
//
// With -buildmode=c-shared, main never runs: the host calls _initialize, which runs package
// initialisation, so an operator declares its states and endpoints as package-level values
// and registers itself in an init function:
//
//	var counts = clink.NewState("count", clink.Prefetch())
//
//	func init() { clink.Register("counter", clink.ProcessFunc(process)) }
//
//	func process(r *clink.Record) error {
//		n, _, err := counts.GetInt64(nil)
//		if err != nil {
//			return err
//		}
//		n++
//		if err := counts.PutInt64(nil, n); err != nil {
//			return err
//		}
//		return clink.Emit(r.Key, strconv.AppendInt(buf[:0], n, 10))
//	}
//
//	func main() {}
//
// The manifest the host reads at load time (ABI version, operator name, state and endpoint
// names) is produced by the clink_manifest export from what was declared during
// initialisation; NewState and NewEndpoint panic when called after that.
//
// # Memory and buffers
//
// The hot path does not allocate: a Record's Key and Value point into the input buffer the
// host writes each record into, and State.Get and Endpoint.Lookup return views of a result
// buffer owned by the SDK. Those slices are valid only until the call returns (Record) or until
// the next Get or Lookup (results); copy what you keep. AppendGet reads into a buffer you own.
//
// # Fast paths
//
// The SDK makes the common case run without import calls (docs/abi.md, "Fast paths"). A state
// declared with [Prefetch] has its per-key value delivered with every record and timer; its nil
// entry is then read and written in place and written back by the host when the call returns
// (see [State]). [Emit] appends records to an output area that the host drains when the call
// returns; a record larger than the area goes through the emit import, after the area is
// flushed, so records always leave in the order they were emitted.
//
// # Errors and panics
//
// Import failures come back as *Error values that errors.Is matches against the sentinels
// (ErrTooLarge, ErrLookupTimeout, ...). An operator method that returns a non-nil error, or
// panics, makes the export return 1 after logging the error message at error level, so the
// host's fault report carries the message (docs/abi.md, "Faults"). A Go runtime fatal error
// (out of memory, stack overflow) cannot be recovered; the runtime writes it to stderr, which
// the host routes to the operator log, and the instance traps.
//
// # Testing
//
// Outside GOOS=wasip1 the imports are served by an in-memory host, so an operator's package can
// be unit-tested natively with package clinktest.
package clink
