package wasmbin

import "math"

// Name section subsections (extended name section proposal numbering).
// See https://webassembly.github.io/spec/core/appendix/custom.html#name-section
const (
	nameModule    = 0
	nameFunctions = 1
	nameLocals    = 2
	nameLabels    = 3
	nameFields    = 10
	nameTags      = 11
)

// names rewrites the content of the "name" custom section, or returns false
// to drop it.
//
// Function names and local names are keyed by function index, so they are
// renumbered, and the fuel import is given a name. Label names are keyed by
// the position of each block in a function, which the inserted if blocks
// change, so they are dropped. Subsections 4-11 (types, tables, memories,
// globals, elements, data, fields, tags) name index spaces the rewrite only
// appends to, so they stay valid and are kept. Unknown subsections are dropped
// because they may hold function indices.
//
// A name section that does not parse is dropped rather than refused: it is
// debug information, and the spec says a malformed custom section must not
// make a module invalid.
func (m *module) names(sec section) ([]byte, bool) {
	s := newStream(m.in, sec.start, sec.end, nil)
	s.name() // "name"
	for s.more() {
		at := s.pos
		id := s.byte()
		size := s.u32()
		if s.err != nil || uint64(size) > uint64(len(s.in)-s.pos) {
			return nil, false
		}
		end := s.pos + int(size)
		switch {
		case id == nameFunctions || id == nameLocals:
			sub := newStream(m.in, s.pos, end, nil)
			if id == nameFunctions {
				m.funcNames(sub)
			} else {
				m.localNames(sub)
			}
			if sub.err != nil || sub.pos != end {
				return nil, false
			}
			content := sub.finish()
			s.flushTo(at)
			s.out = appendSection(s.out, id, content)
			s.pos, s.last = end, end
		case id == nameModule || (nameLabels < id && id <= nameTags):
			s.pos = end
		default:
			s.skipTo(at, end)
		}
	}
	if s.err != nil {
		return nil, false
	}
	return s.finish(), true
}

// funcNames renumbers a function name map and adds the fuel import's name
// in index order.
func (m *module) funcNames(s *stream) {
	at := s.pos
	n := s.count()
	s.replaceU32(at, uint32(n)+1)
	inserted := false
	addImport := func() {
		s.out = appendU32(s.out, m.nImportFuncs)
		s.out = appendName(s.out, fuelImportName)
		inserted = true
	}
	for i := 0; i < n && s.err == nil; i++ {
		entry := s.pos
		idx := s.u32()
		if s.err == nil && idx >= m.nImportFuncs {
			if !inserted {
				s.flushTo(entry)
				addImport()
			}
			if idx == math.MaxUint32 {
				s.failAt(entry, ErrMalformed, "function index %d out of range", idx)
				return
			}
			s.replaceU32(entry, idx+1)
		}
		s.name()
	}
	if !inserted {
		s.flush()
		addImport()
	}
}

// localNames renumbers the functions of a local name map.
func (m *module) localNames(s *stream) {
	n := s.count()
	for i := 0; i < n && s.err == nil; i++ {
		m.funcIdx(s)
		k := s.count()
		for j := 0; j < k && s.err == nil; j++ {
			s.u32()
			s.name()
		}
	}
}
