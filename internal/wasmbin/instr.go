package wasmbin

// Instruction decoding.
//
// The rewrite only edits three things inside function bodies (function
// indices, the end of loop block types, and checks on global indices), but to
// find them it must know where every instruction ends. It must agree with
// wazero on that exactly: if the two disagreed about a boundary, a loop that
// wazero executes could hide inside what this package took for an immediate,
// and run without fuel. So the tables below follow wazero v1.12's validator
// (internal/wasm/func_validation.go), including its quirks:
//
//   - The 0xfd (SIMD) and 0xfe (atomic) sub-opcodes are read as one byte, not
//     as LEB128. Canonical encodings of SIMD opcodes >= 0x80 are two bytes, the
//     second being 0x01, which wazero (and this package) then decodes as nop.
//     No SIMD opcode >= 0x80 has immediates, so this matches the spec for
//     every canonical encoding.
//   - The 0xfc (misc) sub-opcode is LEB128, as in the spec.
//   - ref.null's heap type is one byte for func, extern and exn, otherwise a
//     LEB128 type index.
//   - Block types are s33 values; 0x63 and 0x64 (typed references) are
//     followed by a heap type.
//
// An opcode wazero does not accept is an error naming the opcode and offset.

// imm classifies what follows a one-byte opcode.
type imm uint8

const (
	immInvalid  imm = iota // not an opcode wazero accepts
	immNone                // no immediate
	immBlock               // block type (block, if)
	immLoop                // block type, then the fuel check is inserted
	immTryTable            // block type and catch clauses
	immU32                 // one index or label
	immU32x2               // two indices (call_indirect, return_call_indirect)
	immFunc                // function index (call, return_call, ref.func)
	immGlobal              // global index
	immBrTable             // label vector and default label
	immMemarg              // align and offset
	immI32                 // signed LEB128, 32-bit
	immI64                 // signed LEB128, 64-bit
	immF32                 // 4 bytes
	immF64                 // 8 bytes
	immRefNull             // heap type
	immSelectT             // vector of one value type
	immMisc                // 0xfc prefix
	immVec                 // 0xfd prefix
	immAtomic              // 0xfe prefix
	immLegacyEH            // legacy exception handling, which wazero rejects
)

// opImm gives the immediate class of every one-byte opcode.
var opImm = func() (t [256]imm) {
	set := func(kind imm, ops ...byte) {
		for _, op := range ops {
			t[op] = kind
		}
	}
	span := func(kind imm, from, to byte) {
		for op := int(from); op <= int(to); op++ {
			t[op] = kind
		}
	}
	set(immNone,
		0x00, 0x01, // unreachable nop
		0x05,       // else
		0x0a,       // throw_ref
		0x0b,       // end
		0x0f,       // return
		0x1a, 0x1b, // drop select
		0xd1, // ref.is_null
		0xd4, // ref.as_non_null
	)
	set(immBlock, 0x02, 0x04) // block if
	set(immLoop, 0x03)
	set(immTryTable, 0x1f)
	set(immLegacyEH, 0x06, 0x07, 0x09, 0x18, 0x19) // try catch rethrow delegate catch_all
	set(immU32,
		0x08,       // throw tag
		0x0c, 0x0d, // br br_if
		0x14, 0x15, // call_ref return_call_ref (type index)
		0x20, 0x21, 0x22, // local.get local.set local.tee
		0x25, 0x26, // table.get table.set
		0x3f, 0x40, // memory.size memory.grow (memory index)
		0xd5, 0xd6, // br_on_null br_on_non_null
	)
	set(immU32x2, 0x11, 0x13)      // call_indirect return_call_indirect
	set(immFunc, 0x10, 0x12, 0xd2) // call return_call ref.func
	set(immGlobal, 0x23, 0x24)     // global.get global.set
	set(immBrTable, 0x0e)          // br_table
	span(immMemarg, 0x28, 0x3e)    // loads and stores
	set(immI32, 0x41)              // i32.const
	set(immI64, 0x42)              // i64.const
	set(immF32, 0x43)              // f32.const
	set(immF64, 0x44)              // f64.const
	span(immNone, 0x45, 0xc4)      // numeric, conversions, sign extension
	set(immRefNull, 0xd0)          // ref.null
	set(immSelectT, 0x1c)          // select t*
	set(immMisc, 0xfc)
	set(immVec, 0xfd)
	set(immAtomic, 0xfe)
	return t
}()

// miscImm gives the number of LEB128 immediates of each 0xfc sub-opcode:
// 0-7 saturating truncations, 8 memory.init, 9 data.drop, 10 memory.copy,
// 11 memory.fill, 12 table.init, 13 elem.drop, 14 table.copy, 15 table.grow,
// 16 table.size, 17 table.fill.
var miscImm = [...]uint8{0, 0, 0, 0, 0, 0, 0, 0, 2, 1, 2, 1, 2, 1, 2, 1, 1, 1}

// vecImm classifies what follows a 0xfd sub-opcode.
type vecImmKind uint8

const (
	vecInvalid    vecImmKind = iota
	vecNone                  // no immediate
	vecMemarg                // loads, store, load zero
	vecMemargLane            // load lane, store lane
	vecLane                  // extract lane, replace lane
	vec16                    // v128.const, i8x16.shuffle
)

// vecImm gives the immediate class of every SIMD sub-opcode: the 236 opcodes
// of the fixed-width SIMD proposal, which are those wazero v1.12 accepts.
// Relaxed SIMD it does not accept.
var vecImm = func() (t [256]vecImmKind) {
	for i := range t {
		t[i] = vecNone
	}
	// Unassigned opcodes in the SIMD proposal.
	for _, op := range []byte{0x9a, 0xa2, 0xa5, 0xa6, 0xaf, 0xb0, 0xb2, 0xb3, 0xb4, 0xbb,
		0xc2, 0xc5, 0xc6, 0xcf, 0xd0, 0xd2, 0xd3, 0xd4, 0xe2, 0xee} {
		t[op] = vecInvalid
	}
	for op := 0x00; op <= 0x0b; op++ { // v128.load* and v128.store
		t[op] = vecMemarg
	}
	t[0x0c], t[0x0d] = vec16, vec16 // v128.const i8x16.shuffle
	for op := 0x15; op <= 0x22; op++ {
		t[op] = vecLane
	}
	for op := 0x54; op <= 0x5b; op++ {
		t[op] = vecMemargLane
	}
	t[0x5c], t[0x5d] = vecMemarg, vecMemarg // v128.load32_zero v128.load64_zero
	return t
}()

// instr reads one instruction of a function body and makes the edits it needs.
func (m *module) instr(s *stream) {
	at := s.pos
	op := s.byte()
	if 0x10 <= op && op <= 0x15 { // call call_indirect return_call return_call_indirect call_ref return_call_ref
		m.mayRecur = true
	}
	switch opImm[op] {
	case immNone:
	case immBlock:
		blockType(s)
	case immLoop:
		m.mayRecur = true
		blockType(s)
		if s.err == nil {
			s.insert(m.check)
		}
	case immTryTable:
		blockType(s)
		n := s.count()
		for i := 0; i < n && s.err == nil; i++ {
			switch kind := s.byte(); kind {
			case 0x00, 0x01: // catch, catch_ref: tag and label
				s.u32()
				s.u32()
			case 0x02, 0x03: // catch_all, catch_all_ref: label
				s.u32()
			default:
				s.failAt(s.pos-1, ErrMalformed, "invalid try_table catch kind %#02x", kind)
			}
		}
	case immU32:
		s.u32()
	case immU32x2:
		s.u32()
		s.u32()
	case immFunc:
		m.funcIdx(s)
	case immGlobal:
		m.globalIdx(s)
	case immBrTable:
		n := s.count()
		for i := 0; i <= n && s.err == nil; i++ { // n labels and the default
			s.u32()
		}
	case immMemarg:
		s.u32()
		s.u32()
	case immI32:
		s.skipLEB(5)
	case immI64:
		s.skipLEB(10)
	case immF32:
		s.take(4)
	case immF64:
		s.take(8)
	case immRefNull:
		heapType(s)
	case immSelectT:
		if n := s.u32(); n != 1 && s.err == nil {
			s.failAt(at, ErrMalformed, "select with %d types (must be 1)", n)
			return
		}
		// wazero v1.12 validates select with a typed reference type (0x63 or
		// 0x64 and a heap type), but both its compilers then skip only two
		// bytes and execute the heap type as instructions: the validated code
		// is not the code that runs (the optimising compiler even panics on
		// some, with default features). Refuse it rather than guess which
		// view to instrument.
		if len(s.in) > s.pos && (s.in[s.pos] == 0x63 || s.in[s.pos] == 0x64) && s.err == nil {
			s.failAt(at, ErrUnsupported, "select with a typed reference type, which wazero v1.12 miscompiles")
			return
		}
		m.valType(s)
	case immMisc:
		sub := s.u32()
		if s.err != nil {
			return
		}
		if int64(sub) >= int64(len(miscImm)) {
			s.failAt(at, ErrUnsupported, "unknown opcode 0xfc %d", sub)
			return
		}
		for range miscImm[sub] {
			s.u32()
		}
	case immVec:
		sub := s.byte()
		switch vecImm[sub] {
		case vecNone:
		case vecMemarg:
			s.u32()
			s.u32()
		case vecMemargLane:
			s.u32()
			s.u32()
			s.byte()
		case vecLane:
			s.byte()
		case vec16:
			s.take(16)
		default:
			if s.err == nil {
				s.failAt(at, ErrUnsupported, "unknown opcode 0xfd %#02x", sub)
			}
		}
	case immAtomic:
		switch sub := s.byte(); {
		case s.err != nil:
		case sub <= 0x02 || (0x10 <= sub && sub <= 0x4e): // notify, wait, loads, stores, rmw
			s.u32()
			s.u32()
		case sub == 0x03: // atomic.fence
			s.byte()
		default:
			s.failAt(at, ErrUnsupported, "unknown opcode 0xfe %#02x", sub)
		}
	case immLegacyEH:
		if s.err == nil {
			s.failAt(at, ErrUnsupported, "legacy exception handling opcode %#02x is not supported by wazero "+
				"(translate to exnref with wasm-opt --translate-to-exnref)", op)
		}
	default:
		if s.err == nil {
			s.failAt(at, ErrUnsupported, "unknown opcode %#02x", op)
		}
	}
}

// blockType reads a block type as wazero's DecodeBlockType does: an s33 that
// is a value type, 0x40 (empty) or a type index, where the typed reference
// value types 0x63 (-29) and 0x64 (-28) are followed by a heap type.
func blockType(s *stream) {
	switch s.s33() {
	case -29, -28:
		s.s33()
	}
}
