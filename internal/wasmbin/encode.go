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
//	global.get $fuel
//	i32.const 1
//	i32.lt_s                ;; fuel <= 0 ?
//	if                      ;; block type empty
//	  call $fuel_exhausted  ;; () -> i32: new fuel, or panics to abort the call
//	  global.set $fuel
//	end
//	global.get $fuel
//	i32.const 1
//	i32.sub
//	global.set $fuel
//
// It leaves the operand stack as it found it, and the if block it opens is
// closed before any guest instruction runs, so it is valid anywhere an
// instruction sequence may start (including a loop with parameters) and no
// guest branch depth changes. The fast path is two loads, a compare and
// branch, a subtract and a store.
func fuelCheck(fuel, fn uint32) []byte {
	var b []byte
	b = appendU32(append(b, 0x23), fuel) // global.get
	b = append(b, 0x41, 0x01, 0x48)      // i32.const 1; i32.lt_s
	b = append(b, 0x04, 0x40)            // if (empty)
	b = appendU32(append(b, 0x10), fn)   // call
	b = appendU32(append(b, 0x24), fuel) // global.set
	b = append(b, 0x0b)                  // end
	b = appendU32(append(b, 0x23), fuel) // global.get
	b = append(b, 0x41, 0x01, 0x6b)      // i32.const 1; i32.sub
	b = appendU32(append(b, 0x24), fuel) // global.set
	return b
}
