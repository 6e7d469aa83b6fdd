package abi

// Temporary shim until internal/wasmbin lands: identity instrumentation.
// TODO(lead): replace with internal/wasmbin.

type wasmbinShim struct{}

var wasmbin = struct {
	FuelImportModule string
	FuelImportName   string
	Instrument       func([]byte) ([]byte, error)
}{"clink_internal", "fuel_exhausted", func(b []byte) ([]byte, error) { return b, nil }}
const instrumented = false
