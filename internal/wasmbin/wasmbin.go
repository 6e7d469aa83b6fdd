// Package wasmbin rewrites WebAssembly binaries so that the host can stop a
// running guest call cheaply.
//
// The host must stop runaway guest loops (a per-call time limit) and honour
// context cancellation. wazero can do that itself with
// RuntimeConfig.WithCloseOnContextDone(true), but we measured it: it adds about
// 400 ns to every call (a watcher goroutine per call) and makes guest loops
// about 28 times slower (every loop header exits to Go to poll). Instead,
// Instrument rewrites the guest once, at load time, so that it counts down a
// fuel global and calls one host import when the fuel runs out. The import
// (implemented by the host, not here) checks the call's deadline and context
// and either returns fresh fuel or panics, which wazero turns into a call error.
//
// # The rewrite
//
// Instrument adds, without renumbering anything the guest can observe:
//
//   - a function type () -> i32, reusing an identical standalone one if present;
//   - the function import FuelImportModule.FuelImportName, placed after every
//     existing import, so it is the last imported function: imported function
//     indices are unchanged and every defined function index shifts by one;
//   - a mutable i32 global $fuel, defined after every existing global, so no
//     global index shifts. It starts at 0, so the first check of an instance
//     calls the import at once;
//   - an export of $fuel named FuelExportName, after every existing export.
//
// At the start of every defined function body that has a loop or a call
// instruction (after the locals), and right after the block type of every loop
// instruction, it inserts this
// stack-neutral sequence (see fuelCheck for why this shape):
//
//	block
//	  global.get $fuel
//	  i32.const 1
//	  i32.sub
//	  global.set $fuel      ;; fuel--
//	  global.get $fuel
//	  i32.const 0
//	  i32.ge_s
//	  br_if 0               ;; fuel >= 0: done
//	  call $fuel_exhausted  ;; returns the new fuel F, or panics
//	  i32.const 1
//	  i32.sub
//	  global.set $fuel      ;; fuel = F-1
//	end
//
// Every backward branch in WebAssembly targets a loop, and every cycle of calls
// runs through function bodies that each contain a call, so guest code cannot
// run unboundedly without passing a check: one unit of fuel is one loop
// iteration or one entry into a function that loops or calls. A leaf function
// (no loop, no call) runs each of its instructions at most once per entry, and
// its caller's checks bound how often it is entered, so it has no check. When the
// import returns F, the next F checks (including the one that called it) pass
// without calling it again. A host returning 0 or a negative value (other than
// math.MinInt32, which wraps) gets called again at the next check.
//
// $fuel belongs to the instance, not to a call: a call starts with whatever
// the previous call of the instance left, at most one refill. So the first
// import call of a call can come up to one refill late, which a host that
// refills in small enough units does not notice; the import receives the
// context of the call that is running, whichever call made the refill.
//
// # Invariants the rewrite keeps
//
//   - Guest code cannot reach $fuel or the fuel import. Every guest function
//     index at or above the first defined function shifts by one, so no
//     original index maps to the import. A guest reference to a global index at
//     or past the original global count (which would now name $fuel) is
//     rejected, even though such a module was invalid to begin with: the host
//     compiles only the rewritten module, so Instrument must not turn an
//     invalid guest into a valid one that can refill its own fuel.
//   - A module that already imports anything from FuelImportModule is refused,
//     so a guest cannot pre-empt or shadow the fuel import.
//   - Instruction boundaries are decoded exactly as wazero v1.12 decodes them
//     (see instr.go), so the rewrite sees every loop wazero will execute.
//
// # Notes
//
//   - The "name" custom section is rewritten: function names (subsection 1) and
//     local names (subsection 2) are renumbered and the import is named
//     "clink_internal.fuel_exhausted". Label names (subsection 3) are dropped,
//     because the inserted blocks renumber labels, as are subsections this
//     package does not know. A name section that does not parse is dropped:
//     names are debug information, never semantics.
//   - Other custom sections are copied unchanged. DWARF (.debug_*) sections
//     describe code offsets, which the rewrite moves, so source positions in
//     stack traces of instrumented modules may be off.
//   - Instrument checks structure, not validity: it does not type-check
//     function bodies. Compile the result with wazero, which validates it.
//   - It does refuse input that wazero v1.12 mishandles, because the host
//     compiles only Instrument's output: a vector length larger than the bytes
//     that follow it, and a function with more than 50000 locals (see
//     maxLocals), for which wazero allocates gigabytes before it fails; and a
//     typed select with a reference type (0x63/0x64), which wazero validates
//     but compiles differently (see instr), panicking on some.
//
// See https://webassembly.github.io/spec/core/binary/index.html
package wasmbin

//go:generate sh testdata/gen.sh

import (
	"errors"
	"fmt"
)

const (
	// FuelImportModule is the module name of the fuel import. A guest module
	// that imports anything from it is refused.
	FuelImportModule = "clink_internal"
	// FuelImportName is the name of the fuel import, with signature () -> i32.
	// It is called when the fuel runs out and returns the new fuel value.
	FuelImportName = "fuel_exhausted"
	// FuelExportName is the name under which the rewritten module exports $fuel
	// (a mutable i32), so that the host can set it to 0 from outside a call and
	// make the next check call the import: the host's watchdog does that to stop
	// a call whose refill would last too long. Exports are visible only to the
	// host, never to guest code. A guest module that exports this name is refused.
	FuelExportName = "clink_internal.fuel"
)

// Error kinds. Every error returned by Instrument is an *Error whose Kind is
// one of these, so callers can test it with errors.Is.
var (
	// ErrMalformed means the input is not a well-formed WebAssembly binary.
	ErrMalformed = errors.New("malformed module")
	// ErrUnsupported means the input uses an encoding or feature that wazero
	// v1.12 does not support (GC types, legacy exception handling, ...), or an
	// opcode this package does not know.
	ErrUnsupported = errors.New("unsupported module")
	// ErrReservedImport means the module imports from FuelImportModule.
	ErrReservedImport = errors.New("module imports from reserved module " + FuelImportModule)
	// ErrReservedExport means the module exports FuelExportName itself.
	ErrReservedExport = errors.New("module exports reserved name " + FuelExportName)
)

// Error describes why Instrument refused a module.
type Error struct {
	// Offset is the byte offset in the input at which the problem was found.
	Offset int
	// Kind is ErrMalformed, ErrUnsupported, ErrReservedImport or ErrReservedExport.
	Kind error
	// Msg says what was wrong.
	Msg string
}

func (e *Error) Error() string {
	return fmt.Sprintf("wasmbin: %v at offset %#x: %s", e.Kind, e.Offset, e.Msg)
}

// Unwrap returns e.Kind.
func (e *Error) Unwrap() error { return e.Kind }

// Instrument returns a rewritten copy of bin with a fuel counter added, as
// described in the package documentation. It never modifies bin, and returns
// an *Error (never panics) for malformed or unsupported input.
func Instrument(bin []byte) ([]byte, error) {
	m, err := scan(bin)
	if err != nil {
		return nil, err
	}
	return m.rewrite()
}
