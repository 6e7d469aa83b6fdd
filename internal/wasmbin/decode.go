package wasmbin

import (
	"bytes"
	"fmt"
	"math"
)

// stream reads a region of the input and builds an edited copy of it.
//
// Bytes are copied lazily: in[last:pos] has been read but not yet copied to
// out. An edit first flushes the pending bytes, then appends its replacement,
// so a region without edits is copied by a single append at the end.
//
// Errors are sticky: after the first one, reads return zero values and do not
// advance, so callers check s.err once per loop iteration rather than after
// every read. Every vector count is bounded by the bytes left in the region
// (see count), so a loop driven by a count cannot run long after an error.
//
// INVARIANT: last <= pos <= len(in), and in is the whole input truncated at
// the end of the region, so pos is an absolute input offset (what errors
// report) and no read can cross the end of the region.
type stream struct {
	in   []byte
	pos  int
	last int
	out  []byte
	err  *Error
}

// newStream returns a stream over in[start:end] that appends to out.
func newStream(in []byte, start, end int, out []byte) *stream {
	return &stream{in: in[:end], pos: start, last: start, out: out}
}

func (s *stream) failAt(at int, kind error, format string, args ...any) {
	if s.err == nil {
		s.err = &Error{Offset: at, Kind: kind, Msg: fmt.Sprintf(format, args...)}
	}
}

func (s *stream) fail(kind error, format string, args ...any) {
	s.failAt(s.pos, kind, format, args...)
}

// more reports whether there are bytes left to read and no error so far.
func (s *stream) more() bool { return s.err == nil && s.pos < len(s.in) }

func (s *stream) byte() byte {
	if s.err != nil {
		return 0
	}
	if s.pos >= len(s.in) {
		s.fail(ErrMalformed, "unexpected end of section or function body")
		return 0
	}
	b := s.in[s.pos]
	s.pos++
	return b
}

// take returns the next n bytes.
func (s *stream) take(n int) []byte {
	if s.err != nil {
		return nil
	}
	if n < 0 || n > len(s.in)-s.pos {
		s.fail(ErrMalformed, "need %d bytes, only %d left in section or function body", n, len(s.in)-s.pos)
		return nil
	}
	b := s.in[s.pos : s.pos+n]
	s.pos += n
	return b
}

// u32 reads an unsigned LEB128 value of at most 5 bytes, accepting exactly
// what wazero's leb128.DecodeUint32 accepts (including padded encodings).
func (s *stream) u32() uint32 {
	at := s.pos
	var v uint32
	for i := 0; i < 5; i++ {
		b := s.byte()
		if s.err != nil {
			return 0
		}
		if b < 0x80 {
			if i == 4 && b&0xf0 != 0 {
				s.failAt(at, ErrMalformed, "LEB128 value overflows 32 bits")
				return 0
			}
			return v | uint32(b)<<(7*i)
		}
		v |= uint32(b&0x7f) << (7 * i)
	}
	s.failAt(at, ErrMalformed, "LEB128 value longer than 5 bytes")
	return 0
}

// s33 reads a signed 33-bit LEB128 value (block types, heap types). It is a
// port of wazero's leb128.DecodeInt33AsInt64 so that the two agree on where
// the value ends, including wazero's habit of stopping after 5 bytes.
func (s *stream) s33() int64 {
	at := s.pos
	var ret, b int64
	shift, n := 0, 0
	for shift < 35 {
		b = int64(s.byte())
		if s.err != nil {
			return 0
		}
		ret |= (b &^ 0x80) << shift
		shift += 7
		n++
		if b&0x80 == 0 {
			break
		}
	}
	if shift < 33 && b&0x40 != 0 {
		ret |= (1<<33 - 1) << shift
	}
	ret &= 1<<33 - 1
	if ret&(1<<32) != 0 {
		ret -= 1 << 33
	}
	if n == 5 && ((ret < 0 && b&0x20 == 0) || (ret >= 0 && b&0x20 != 0)) {
		s.failAt(at, ErrMalformed, "LEB128 value overflows 33 bits")
		return 0
	}
	return ret
}

// skipLEB skips a LEB128 value of at most maxLen bytes whose value the
// rewrite does not need (i32.const and i64.const immediates). wazero decodes
// those until the first byte without the continuation bit, as this does.
func (s *stream) skipLEB(maxLen int) {
	at := s.pos
	for i := 0; i < maxLen; i++ {
		if s.byte()&0x80 == 0 {
			return
		}
	}
	s.failAt(at, ErrMalformed, "LEB128 value longer than %d bytes", maxLen)
}

// count reads a vector length. Every vector element takes at least one byte,
// so a length larger than the bytes left is malformed; bounding it here keeps
// loops over vectors short even when the input lies.
func (s *stream) count() int {
	at := s.pos
	n := s.u32()
	if s.err == nil && uint64(n) > uint64(len(s.in)-s.pos) {
		s.failAt(at, ErrMalformed, "vector length %d exceeds the %d bytes left", n, len(s.in)-s.pos)
		return 0
	}
	return int(n)
}

// name reads a length-prefixed byte string.
func (s *stream) name() []byte { return s.take(s.count()) }

// flushTo copies the pending input bytes up to at (< pos) to out.
func (s *stream) flushTo(at int) {
	s.out = append(s.out, s.in[s.last:at]...)
	s.last = at
}

// flush copies the pending input bytes up to pos to out.
func (s *stream) flush() { s.flushTo(s.pos) }

// replaceU32 replaces the input bytes from at to pos with v encoded as LEB128.
func (s *stream) replaceU32(at int, v uint32) {
	s.flushTo(at)
	s.out = appendU32(s.out, v)
	s.last = s.pos
}

// insert adds b to the output at the current position.
func (s *stream) insert(b []byte) {
	s.flush()
	s.out = append(s.out, b...)
}

// skipTo drops the input bytes from at to end from the output and moves past them.
func (s *stream) skipTo(at, end int) {
	s.flushTo(at)
	s.pos, s.last = end, end
}

// finish flushes the rest of the region and returns the output.
func (s *stream) finish() []byte {
	s.flush()
	return s.out
}

// Section IDs. See https://webassembly.github.io/spec/core/binary/modules.html#sections
const (
	secCustom    = 0
	secType      = 1
	secImport    = 2
	secFunction  = 3
	secTable     = 4
	secMemory    = 5
	secGlobal    = 6
	secExport    = 7
	secStart     = 8
	secElement   = 9
	secCode      = 10
	secData      = 11
	secDataCount = 12
	secTag       = 13 // exception handling
)

// sectionRank orders the non-custom sections as the spec requires: the tag
// section sits between memory and global, and data count between element and
// code. wazero's checkSectionOrder enforces the same order.
var sectionRank = [...]int{
	secType: 1, secImport: 2, secFunction: 3, secTable: 4, secMemory: 5,
	secTag: 6, secGlobal: 7, secExport: 8, secStart: 9, secElement: 10,
	secDataCount: 11, secCode: 12, secData: 13,
}

// section is one section of the input.
type section struct {
	id         byte
	hdr        int // offset of the section id byte
	start, end int // content range
}

// module is what the first pass learns about the input, and the state of the
// second pass that writes the output.
type module struct {
	in       []byte
	sections []section

	// scanning is set during the first pass, which only counts: function and
	// global indices are neither checked nor shifted because the counts they
	// depend on are not known yet.
	scanning bool

	has [len(sectionRank)]bool // which sections the input has

	nTypes         uint32 // size of the type index space
	fuelType       uint32 // type index of () -> i32 for the import
	reuseType      bool   // fuelType names an existing type
	nImportFuncs   uint32 // = index of the fuel import
	nGlobals       uint32 // imported + defined globals = index of $fuel
	nImportGlobals uint32
	nFuncs         uint32 // defined functions (function section length)

	check []byte // the inserted fuel check, see fuelCheck

	// Per function body, while it is rewritten: where its entry check starts in the output,
	// and whether the body has a loop or a call (else the entry check is dropped, see
	// dropLeafCheck).
	entryCheck int
	mayRecur   bool

	out     []byte // the output module
	secBuf  []byte // reused buffer for one section's content
	bodyBuf []byte // reused buffer for one function body
}

// wasmHeader is the magic number and the only binary version wazero accepts.
var wasmHeader = []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}

// Limits wazero v1.12 enforces on index spaces (internal/wasm/module.go).
const (
	maxFunctions = 1 << 27
	maxGlobals   = 1 << 27
)

// scan is the first pass: it splits the input into sections, checks their
// order, and counts the index spaces the rewrite depends on.
func scan(in []byte) (*module, error) {
	if len(in) < len(wasmHeader) || !bytes.Equal(in[:4], wasmHeader[:4]) {
		return nil, &Error{Offset: 0, Kind: ErrMalformed, Msg: "missing \\0asm magic number"}
	}
	if !bytes.Equal(in[4:8], wasmHeader[4:]) {
		return nil, &Error{Offset: 4, Kind: ErrUnsupported, Msg: "binary version is not 1"}
	}
	m := &module{in: in, scanning: true}
	s := newStream(in, len(wasmHeader), len(in), nil)
	prevRank := 0
	for s.more() {
		hdr := s.pos
		id := s.byte()
		size := s.u32()
		if s.err != nil {
			break
		}
		if uint64(size) > uint64(len(in)-s.pos) {
			s.failAt(hdr, ErrMalformed, "section %d claims %d bytes, only %d left", id, size, len(in)-s.pos)
			break
		}
		sec := section{id: id, hdr: hdr, start: s.pos, end: s.pos + int(size)}
		s.pos = sec.end
		if id != secCustom {
			if int(id) >= len(sectionRank) {
				s.failAt(hdr, ErrMalformed, "unknown section id %d", id)
				break
			}
			if sectionRank[id] <= prevRank {
				s.failAt(hdr, ErrMalformed, "section %d is out of order or repeated", id)
				break
			}
			prevRank = sectionRank[id]
			m.has[id] = true
		}
		m.sections = append(m.sections, sec)
		if err := m.scanSection(sec); err != nil {
			return nil, err
		}
	}
	if s.err != nil {
		return nil, s.err
	}
	if !m.reuseType {
		m.fuelType = m.nTypes
	}
	if uint64(m.nImportFuncs)+uint64(m.nFuncs)+1 > maxFunctions {
		return nil, &Error{Offset: 0, Kind: ErrUnsupported, Msg: "too many functions to add the fuel import"}
	}
	if uint64(m.nGlobals)+1 > maxGlobals {
		return nil, &Error{Offset: 0, Kind: ErrUnsupported, Msg: "too many globals to add the fuel global"}
	}
	m.check = fuelCheck(m.nGlobals, m.nImportFuncs)
	m.scanning = false
	return m, nil
}

// scanSection reads what the first pass needs from one section.
func (m *module) scanSection(sec section) *Error {
	s := newStream(m.in, sec.start, sec.end, nil)
	switch sec.id {
	case secCustom:
		s.name()
		if s.err != nil {
			return s.err
		}
		return nil // the content is not looked at until the second pass
	case secType:
		m.scanTypes(s)
	case secImport:
		m.imports(s)
	case secFunction:
		m.nFuncs = uint32(s.count())
		return s.err // the type indices that follow are copied unchanged
	case secGlobal:
		n := uint32(s.count())
		m.nGlobals = m.nImportGlobals + n
		return s.err // the globals are read in the second pass
	default:
		return nil
	}
	if s.err == nil && s.pos != sec.end {
		s.fail(ErrMalformed, "section %d has %d unread bytes", sec.id, sec.end-s.pos)
	}
	return s.err
}

// scanTypes counts the type index space and looks for a standalone () -> i32.
//
// wazero v1.12 accepts function types (0x60) and recursion groups (0x4e) of
// function types; subtypes, structs and arrays (the rest of the GC proposal)
// it rejects, and so does this.
func (m *module) scanTypes(s *stream) {
	n := s.count()
	for i := 0; i < n && s.err == nil; i++ {
		at := s.pos
		switch b := s.byte(); b {
		case 0x60:
			s.pos = at
			m.funcType(s)
			if !m.reuseType && bytes.Equal(s.in[at:s.pos], fuelFuncType) {
				m.fuelType, m.reuseType = m.nTypes, true
			}
			m.nTypes++
		case 0x4e: // rec group: members share an identity, so none is reused
			k := s.count()
			for j := 0; j < k && s.err == nil; j++ {
				m.funcType(s)
				m.nTypes++
			}
		case 0x50, 0x4f, 0x5f, 0x5e:
			s.failAt(at, ErrUnsupported, "GC proposal type (form %#02x) is not supported by wazero", b)
		default:
			s.failAt(at, ErrMalformed, "invalid type form %#02x", b)
		}
	}
}

// funcType reads 0x60 params results.
func (m *module) funcType(s *stream) {
	if b := s.byte(); b != 0x60 && s.err == nil {
		s.failAt(s.pos-1, ErrUnsupported, "type form %#02x is not a function type", b)
		return
	}
	for range 2 { // params, results
		n := s.count()
		for i := 0; i < n && s.err == nil; i++ {
			m.valType(s)
		}
	}
}

// valType reads a value type: a one-byte type, or a typed reference
// (0x63 nullable / 0x64 non-nullable) followed by a heap type.
func (m *module) valType(s *stream) {
	switch b := s.byte(); b {
	case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, // i32 i64 f32 f64 v128
		0x70, 0x6f, 0x69: // funcref externref exnref
	case 0x63, 0x64:
		s.s33()
	case 0x6e, 0x6d, 0x6c, 0x6b, 0x6a, 0x71, 0x72, 0x73, 0x74:
		s.failAt(s.pos-1, ErrUnsupported, "GC proposal value type %#02x is not supported by wazero", b)
	default:
		if s.err == nil {
			s.failAt(s.pos-1, ErrMalformed, "invalid value type %#02x", b)
		}
	}
}

// imports reads the import section and counts function and global imports.
// In the second pass it also rewrites it: the vector length grows by one (the
// caller appends the fuel import) and table initialisers are rewritten.
func (m *module) imports(s *stream) {
	countAt := s.pos
	n := s.count()
	if !m.scanning {
		s.replaceU32(countAt, uint32(n)+1)
	}
	var funcs, globals uint32
	for i := 0; i < n && s.err == nil; i++ {
		at := s.pos
		mod := s.name()
		s.name()
		if s.err == nil && string(mod) == FuelImportModule {
			s.failAt(at, ErrReservedImport, "import %d is from %q", i, mod)
			return
		}
		switch kind := s.byte(); kind {
		case 0x00: // func
			s.u32()
			funcs++
		case 0x01: // table
			m.tableType(s)
		case 0x02: // memory
			limits(s)
		case 0x03: // global
			m.valType(s)
			s.byte()
			globals++
		case 0x04: // tag
			s.byte()
			s.u32()
		default:
			if s.err == nil {
				s.failAt(s.pos-1, ErrMalformed, "invalid import kind %#02x", kind)
			}
		}
	}
	if m.scanning {
		m.nImportFuncs, m.nImportGlobals = funcs, globals
		m.nGlobals = globals // plus defined globals, added by the global section
	}
}

// tableType reads a table type. Like wazero's decodeTable it accepts the
// 0x40 0x00 prefix of a table with an initialiser expression (function
// references proposal), whose ref.func indices need rewriting.
func (m *module) tableType(s *stream) {
	init := false
	if len(s.in) > s.pos && s.in[s.pos] == 0x40 {
		s.pos++
		if b := s.byte(); b != 0x00 && s.err == nil {
			s.failAt(s.pos-1, ErrMalformed, "expected 0x00 after table prefix 0x40, got %#02x", b)
		}
		init = true
	}
	refType(s)
	limits(s)
	if init {
		m.constExpr(s)
	}
}

// refType reads the reference type of a table or element segment.
func refType(s *stream) {
	switch b := s.byte(); b {
	case 0x63, 0x64:
		s.s33()
	}
}

// limits reads memory or table limits. wazero accepts flags 0-3 (bit 0: has
// max, bit 1: shared); memory64 limits it rejects.
func limits(s *stream) {
	flags := s.byte()
	if flags > 3 {
		if s.err == nil {
			s.failAt(s.pos-1, ErrUnsupported, "limits flags %#02x (memory64?) are not supported by wazero", flags)
		}
		return
	}
	s.u32()
	if flags&1 != 0 {
		s.u32()
	}
}

// funcIdx reads a function index and, in the second pass, shifts it past the
// fuel import.
func (m *module) funcIdx(s *stream) {
	at := s.pos
	idx := s.u32()
	if m.scanning || s.err != nil || idx < m.nImportFuncs {
		return
	}
	if idx == math.MaxUint32 {
		s.failAt(at, ErrMalformed, "function index %d out of range", idx)
		return
	}
	s.replaceU32(at, idx+1)
}

// globalIdx reads a global index and refuses one that would name $fuel (or
// anything past it) in the output.
func (m *module) globalIdx(s *stream) {
	at := s.pos
	idx := s.u32()
	if !m.scanning && s.err == nil && idx >= m.nGlobals {
		s.failAt(at, ErrMalformed, "global index %d out of range (the module has %d globals)", idx, m.nGlobals)
	}
}

// constExpr reads a constant expression up to and including its end opcode,
// rewriting ref.func indices. The accepted opcodes are those of wazero's
// decodeConstantExpression: constants, global.get, ref.null, ref.func,
// v128.const and the extended-const arithmetic.
func (m *module) constExpr(s *stream) {
	for s.err == nil {
		at := s.pos
		switch op := s.byte(); op {
		case 0x0b: // end
			return
		case 0x41: // i32.const
			s.skipLEB(5)
		case 0x42: // i64.const
			s.skipLEB(10)
		case 0x43: // f32.const
			s.take(4)
		case 0x44: // f64.const
			s.take(8)
		case 0x6a, 0x6b, 0x6c, 0x7c, 0x7d, 0x7e: // i32/i64 add sub mul
		case 0x23: // global.get
			m.globalIdx(s)
		case 0xd0: // ref.null
			heapType(s)
		case 0xd2: // ref.func
			m.funcIdx(s)
		case 0xfd: // v128.const, the one vector opcode allowed here
			if sub := s.byte(); sub != 0x0c && s.err == nil {
				s.failAt(at, ErrMalformed, "opcode 0xfd %#02x is not allowed in a constant expression", sub)
				return
			}
			s.take(16)
		default:
			if s.err == nil {
				s.failAt(at, ErrMalformed, "opcode %#02x is not allowed in a constant expression", op)
			}
		}
	}
}

// heapType reads the immediate of ref.null the way wazero does: one byte for
// funcref (0x70), externref (0x6f) or exnref (0x69), otherwise a type index.
func heapType(s *stream) {
	if s.pos < len(s.in) {
		switch s.in[s.pos] {
		case 0x70, 0x6f, 0x69:
			s.pos++
			return
		}
	}
	s.u32()
}
