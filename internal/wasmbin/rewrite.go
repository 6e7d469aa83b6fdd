package wasmbin

// rewrite is the second pass: it writes the output module section by section.
//
// Sections that hold no function or global index (function, memory, data
// count, custom sections other than "name") are copied as they are. The type,
// import and global sections gain one entry each; when the input lacks one of
// them it is created, in its place in the section order.
func (m *module) rewrite() ([]byte, error) {
	m.out = make([]byte, 0, len(m.in)+len(m.in)/4+64)
	m.out = append(m.out, wasmHeader...)
	created := [len(sectionRank)]bool{}
	// addMissing creates, before a section of rank r, the sections the rewrite
	// needs that the input lacks and that must precede it.
	addMissing := func(r int) {
		for _, id := range [...]byte{secType, secImport, secGlobal, secExport} {
			if !m.has[id] && !created[id] && sectionRank[id] < r {
				created[id] = true
				m.out = appendSection(m.out, id, m.newSection(id))
			}
		}
	}
	for _, sec := range m.sections {
		if sec.id == secCustom {
			if err := m.custom(sec); err != nil {
				return nil, err
			}
			continue
		}
		addMissing(sectionRank[sec.id])
		var rw func(*stream)
		switch sec.id {
		case secType:
			rw = m.types
		case secImport:
			rw = func(s *stream) {
				m.imports(s)
				s.insert(fuelImport(m.fuelType))
			}
		case secTable:
			rw = m.tables
		case secGlobal:
			rw = m.globals
		case secExport:
			rw = m.exports
		case secStart:
			rw = m.funcIdx
		case secElement:
			rw = m.elems
		case secCode:
			rw = m.code
		case secData:
			rw = m.data
		case secTag:
			rw = tags
		default: // function, memory, data count
			m.out = append(m.out, m.in[sec.hdr:sec.end]...)
			continue
		}
		s := newStream(m.in, sec.start, sec.end, m.secBuf[:0])
		rw(s)
		if s.err == nil && s.pos != sec.end {
			s.fail(ErrMalformed, "section %d has %d unread bytes", sec.id, sec.end-s.pos)
		}
		if s.err != nil {
			return nil, s.err
		}
		m.secBuf = s.finish()
		m.out = appendSection(m.out, sec.id, m.secBuf)
	}
	addMissing(len(sectionRank) + 1)
	if m.nFuncs > 0 && !m.has[secCode] {
		return nil, &Error{Offset: len(m.in), Kind: ErrMalformed, Msg: "function section without code section"}
	}
	return m.out, nil
}

// newSection returns the content of a section the input lacks.
func (m *module) newSection(id byte) []byte {
	switch id {
	case secType:
		return append([]byte{1}, fuelFuncType...)
	case secImport:
		return append([]byte{1}, fuelImport(m.fuelType)...)
	case secGlobal:
		return append([]byte{1}, fuelGlobal...)
	default: // secExport
		return append([]byte{1}, fuelExport(m.nGlobals)...)
	}
}

// types appends () -> i32 unless an identical type is reused. Type entries
// hold no function or global indices, so they are copied unread.
func (m *module) types(s *stream) {
	if m.reuseType {
		s.pos = len(s.in)
		return
	}
	at := s.pos
	n := s.count()
	s.replaceU32(at, uint32(n)+1)
	s.pos = len(s.in)
	s.insert(fuelFuncType)
}

// tables rewrites ref.func in table initialiser expressions.
func (m *module) tables(s *stream) {
	n := s.count()
	for i := 0; i < n && s.err == nil; i++ {
		m.tableType(s)
	}
}

// globals rewrites the initialisers and appends $fuel.
func (m *module) globals(s *stream) {
	at := s.pos
	n := s.count()
	s.replaceU32(at, uint32(n)+1)
	for i := 0; i < n && s.err == nil; i++ {
		m.valType(s)
		if mut := s.byte(); mut > 1 && s.err == nil {
			s.failAt(s.pos-1, ErrMalformed, "invalid global mutability %#02x", mut)
		}
		m.constExpr(s)
	}
	if s.err == nil {
		s.insert(fuelGlobal)
	}
}

// exports shifts exported function indices, refuses to export a global index
// that would name $fuel or the name under which $fuel is exported, and appends
// the export of $fuel.
func (m *module) exports(s *stream) {
	at := s.pos
	n := s.count()
	s.replaceU32(at, uint32(n)+1)
	for i := 0; i < n && s.err == nil; i++ {
		nameAt := s.pos
		if name := s.name(); s.err == nil && string(name) == FuelExportName {
			s.failAt(nameAt, ErrReservedExport, "export %d is named %q", i, FuelExportName)
			return
		}
		switch kind := s.byte(); kind {
		case 0x00: // func
			m.funcIdx(s)
		case 0x03: // global
			m.globalIdx(s)
		case 0x01, 0x02, 0x04: // table, memory, tag
			s.u32()
		default:
			if s.err == nil {
				s.failAt(s.pos-1, ErrMalformed, "invalid export kind %#02x", kind)
			}
		}
	}
	if s.err == nil {
		s.insert(fuelExport(m.nGlobals))
	}
}

// elems rewrites the element section. The segment flags select one of eight
// encodings: bit 0 passive or declarative, bit 1 explicit table index (when
// active) or declarative (when not), bit 2 expressions instead of function
// indices. See https://webassembly.github.io/spec/core/binary/modules.html#element-section
func (m *module) elems(s *stream) {
	n := s.count()
	for i := 0; i < n && s.err == nil; i++ {
		at := s.pos
		flags := s.u32()
		if flags > 7 {
			if s.err == nil {
				s.failAt(at, ErrMalformed, "invalid element segment flags %d", flags)
			}
			return
		}
		active := flags&1 == 0
		if active && flags&2 != 0 {
			s.u32() // table index
		}
		if active {
			m.constExpr(s) // offset
		}
		exprs := flags&4 != 0
		if flags&3 != 0 { // forms 0 and 4 imply funcref and have no type byte
			if exprs {
				refType(s)
			} else if kind := s.byte(); kind != 0x00 && s.err == nil {
				s.failAt(s.pos-1, ErrMalformed, "invalid element kind %#02x", kind)
			}
		}
		k := s.count()
		for j := 0; j < k && s.err == nil; j++ {
			if exprs {
				m.constExpr(s)
			} else {
				m.funcIdx(s)
			}
		}
	}
}

// data rewrites the offset expressions of active data segments.
func (m *module) data(s *stream) {
	n := s.count()
	for i := 0; i < n && s.err == nil; i++ {
		at := s.pos
		switch flags := s.u32(); flags {
		case 0:
			m.constExpr(s)
		case 1:
		case 2:
			s.u32() // memory index
			m.constExpr(s)
		default:
			if s.err == nil {
				s.failAt(at, ErrMalformed, "invalid data segment flags %d", flags)
			}
		}
		s.name() // the bytes
	}
}

// tags checks the shape of the tag section, which is copied unchanged: its
// length must be plausible, because wazero allocates it before reading it.
func tags(s *stream) {
	n := s.count()
	for i := 0; i < n && s.err == nil; i++ {
		if attr := s.byte(); attr != 0 && s.err == nil {
			s.failAt(s.pos-1, ErrMalformed, "invalid tag attribute %#02x", attr)
		}
		s.u32() // type index
	}
}

// code rewrites every function body. Bodies change size, so each is built in
// m.bodyBuf and written after its new size.
func (m *module) code(s *stream) {
	at := s.pos
	n := s.count()
	if s.err == nil && uint32(n) != m.nFuncs {
		s.failAt(at, ErrMalformed, "code section has %d bodies, function section declares %d", n, m.nFuncs)
		return
	}
	for i := 0; i < n && s.err == nil; i++ {
		sizeAt := s.pos
		size := s.u32()
		if s.err != nil {
			return
		}
		if uint64(size) > uint64(len(s.in)-s.pos) {
			s.failAt(sizeAt, ErrMalformed, "function body %d claims %d bytes, only %d left", i, size, len(s.in)-s.pos)
			return
		}
		end := s.pos + int(size)
		b := newStream(s.in, s.pos, end, m.bodyBuf[:0])
		m.body(b)
		if b.err != nil {
			s.err = b.err
			return
		}
		m.bodyBuf = m.dropLeafCheck(b.finish())
		s.flushTo(sizeAt)
		s.out = appendU32(s.out, uint32(len(m.bodyBuf)))
		s.out = append(s.out, m.bodyBuf...)
		s.pos, s.last = end, end
	}
}

// maxLocals bounds the locals of one function. The spec allows 2^32, but
// wazero allocates a slice of them all when it decodes the body, so six bytes
// of guest input could ask the host for 4 GiB. 50000 is the limit of the
// WebAssembly JavaScript API, which toolchains already respect.
const maxLocals = 50000

// body rewrites one function body: the fuel check goes after the locals, and
// after every loop's block type (see instr).
func (m *module) body(s *stream) {
	start := s.pos
	n := s.count()
	var locals uint64
	for i := 0; i < n && s.err == nil; i++ {
		at := s.pos
		locals += uint64(s.u32())
		if locals > maxLocals {
			s.failAt(at, ErrUnsupported, "function declares more than %d locals", maxLocals)
			return
		}
		m.valType(s)
	}
	if s.err != nil {
		return
	}
	if s.pos == len(s.in) || s.in[len(s.in)-1] != 0x0b {
		s.failAt(start, ErrMalformed, "function body does not end with the end opcode")
		return
	}
	s.insert(m.check)
	m.entryCheck = len(s.out) - len(m.check)
	m.mayRecur = false
	for s.more() {
		m.instr(s)
	}
}

// dropLeafCheck removes the entry check from a finished body that has no loop and makes no call
// (a leaf): such a function runs at most once through its instructions, so it cannot run
// unboundedly, and every unbounded execution still passes a check (a backward branch targets a
// loop header; a cycle of calls goes through function bodies that each contain a call). Small
// leaf helpers are common in compiled code (AssemblyScript's runtime is full of them), and the
// check made every call to one pay for a decrement, a branch and the register pressure of the
// slow path's call.
func (m *module) dropLeafCheck(body []byte) []byte {
	if m.mayRecur {
		return body
	}
	return append(body[:m.entryCheck], body[m.entryCheck+len(m.check):]...)
}

// custom copies a custom section, rewriting the name section.
func (m *module) custom(sec section) error {
	s := newStream(m.in, sec.start, sec.end, nil)
	name := s.name()
	if s.err != nil {
		return s.err
	}
	if string(name) != "name" {
		m.out = append(m.out, m.in[sec.hdr:sec.end]...)
		return nil
	}
	if content, ok := m.names(sec); ok {
		m.out = appendSection(m.out, secCustom, content)
	}
	return nil
}
