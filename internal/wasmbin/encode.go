package wasmbin

// appendU32 appends v as canonical (shortest) unsigned LEB128.
func appendU32(b []byte, v uint32) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// appendName appends a length-prefixed string.
func appendName(b []byte, s string) []byte {
	b = appendU32(b, uint32(len(s)))
	return append(b, s...)
}

// appendSection appends a section with the given id and content.
func appendSection(b []byte, id byte, content []byte) []byte {
	b = append(b, id)
	b = appendU32(b, uint32(len(content)))
	return append(b, content...)
}

// fuelFuncType is the encoding of the function type () -> i32.
var fuelFuncType = []byte{0x60, 0x00, 0x01, 0x7f}

// fuelGlobal is the encoding of the $fuel global: a mutable i32 initialised to
// 0, so that the first check of an instance calls the import straight away.
var fuelGlobal = []byte{0x7f, 0x01, 0x41, 0x00, 0x0b}

// fuelExport returns the export entry for $fuel.
func fuelExport(fuel uint32) []byte {
	b := appendName(nil, FuelExportName)
	b = append(b, 0x03) // global
	return appendU32(b, fuel)
}

// fuelImportName is the name given to the fuel import in the name section.
const fuelImportName = FuelImportModule + "." + FuelImportName

// fuelImport returns the import entry for the fuel function.
func fuelImport(typeIdx uint32) []byte {
	b := appendName(nil, FuelImportModule)
	b = appendName(b, FuelImportName)
	b = append(b, 0x00) // func
	return appendU32(b, typeIdx)
}

// fuelCheck returns the code inserted at every function entry and loop header,
// given the indices of $fuel and of the fuel import:
//
//	block                   ;; block type empty
//	  global.get $fuel
//	  i32.const 1
//	  i32.sub
//	  global.set $fuel      ;; fuel--
//	  global.get $fuel
//	  i32.const 0
//	  i32.ge_s
//	  br_if 0               ;; fuel >= 0: done
//	  call $fuel_exhausted  ;; () -> i32: new fuel F, or panics to abort the call
//	  i32.const 1
//	  i32.sub
//	  global.set $fuel      ;; fuel = F-1: this check uses one unit
//	end
//
// It leaves the operand stack as it found it, and the block it opens is closed
// before any guest instruction runs, so it is valid anywhere an instruction
// sequence may start (including a loop with parameters) and no guest branch
// depth changes.
//
// Why this shape: we measured variants with wazero's optimising compiler
// (wazevo, v1.12) on an AMD EPYC. The obvious sequence (test the fuel, refill
// in an if, then decrement: two loads of $fuel) made a tight 1000-iteration
// loop 1.6 times slower; so did an if-less variant that decrements last, and
// one that keeps the fuel in a local. Decrementing first and leaving the block
// early costs almost nothing on that loop (see BenchmarkLoopOverhead), and
// wazevo reuses the decremented value for the compare instead of loading it
// again.
//
// What remains costs more in loops whose body makes no call, such as the
// dispatch loops the Go compiler emits (BenchmarkGoOverhead: about 2x on an
// empty counting loop, about 1.15x on ordinary Go code). The cause is the call
// in the slow path: wazevo keeps a value that is live across any call in a
// stack slot for its whole live range (we read the generated code), so the
// loop's own variables move from registers to the stack. Keeping the fuel in
// a local does not avoid that (the local is live across the call too), and
// moving the call out of the loop would not either (the loop variables would
// be live across it). Only the compiler could do better, by splitting live
// ranges around cold calls. Loops that already call functions, which is most
// real code, do not pay this. See RATIONALE.md.
func fuelCheck(fuel, fn uint32) []byte {
	b := []byte{0x02, 0x40}              // block (empty)
	b = appendU32(append(b, 0x23), fuel) // global.get
	b = append(b, 0x41, 0x01, 0x6b)      // i32.const 1; i32.sub
	b = appendU32(append(b, 0x24), fuel) // global.set
	b = appendU32(append(b, 0x23), fuel) // global.get
	b = append(b, 0x41, 0x00, 0x4e)      // i32.const 0; i32.ge_s
	b = append(b, 0x0d, 0x00)            // br_if 0
	b = appendU32(append(b, 0x10), fn)   // call
	b = append(b, 0x41, 0x01, 0x6b)      // i32.const 1; i32.sub
	b = appendU32(append(b, 0x24), fuel) // global.set
	return append(b, 0x0b)               // end
}
