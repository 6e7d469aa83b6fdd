package state

import (
	"encoding/binary"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// A manifest commits one checkpoint of one subtask lineage (a key-group range): it names the
// live segments, newest first, and carries the operator-state blobs. Manifests are immutable
// and created exactly once (conditional create), so the existence of a manifest is the commit
// point of that subtask's checkpoint. See docs/state-format.md.

const (
	manMagic         = "CLKMAN01"
	manFormatVersion = 1
	maxManifestSegs  = 1 << 20
	maxOpStates      = 1 << 16
)

type manifest struct {
	checkpoint uint64
	parent     uint64 // checkpoint this one is incremental on; 0 for none
	numKG      int
	rng        KeyGroupRange // key groups the lineage owns
	savepoint  bool
	createdMS  int64
	epoch      uint64 // writer epoch of the lineage head when committed
	segs       []segRef
	opState    []namedBlob // sorted by name
}

// segRef is a segment as used by a manifest: which key groups of it are live.
type segRef struct {
	segInfo
	use KeyGroupRange // key groups of this segment the manifest reads; ⊆ rng
}

type namedBlob struct {
	name string
	data []byte
}

func encodeManifest(m *manifest) []byte {
	b := []byte(manMagic)
	b = binary.AppendUvarint(b, manFormatVersion)
	b = binary.AppendUvarint(b, m.checkpoint)
	b = binary.AppendUvarint(b, m.parent)
	b = binary.AppendUvarint(b, uint64(m.numKG))
	b = binary.AppendUvarint(b, uint64(m.rng.Lo))
	b = binary.AppendUvarint(b, uint64(m.rng.Hi))
	var flags uint64
	if m.savepoint {
		flags |= 1
	}
	b = binary.AppendUvarint(b, flags)
	b = binary.AppendUvarint(b, uint64(m.createdMS))
	b = binary.AppendUvarint(b, m.epoch)
	b = binary.AppendUvarint(b, uint64(len(m.segs)))
	for _, s := range m.segs {
		b = appendBytes(b, []byte(s.name))
		b = binary.AppendUvarint(b, uint64(s.size))
		b = binary.AppendUvarint(b, uint64(s.metaOff))
		b = binary.AppendUvarint(b, uint64(s.metaLen))
		b = binary.AppendUvarint(b, uint64(s.kgLo))
		b = binary.AppendUvarint(b, uint64(s.kgHi))
		b = appendBytes(b, s.minKey)
		b = appendBytes(b, s.maxKey)
		b = binary.AppendUvarint(b, s.count)
		b = binary.AppendUvarint(b, uint64(s.use.Lo))
		b = binary.AppendUvarint(b, uint64(s.use.Hi))
	}
	b = binary.AppendUvarint(b, uint64(len(m.opState)))
	for _, o := range m.opState {
		b = appendBytes(b, []byte(o.name))
		b = appendBytes(b, o.data)
	}
	return binary.LittleEndian.AppendUint32(b, crc32c(b))
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// decodeManifest parses and verifies a manifest object.
func decodeManifest(object string, b []byte) (*manifest, error) {
	if len(b) < len(manMagic)+4 || string(b[:len(manMagic)]) != manMagic {
		return nil, corruptf(object, 0, "bad manifest magic")
	}
	body := b[:len(b)-4]
	if crc32c(body) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, corruptf(object, 0, "manifest checksum mismatch")
	}
	d := decoder{b: body[len(manMagic):]}
	if v := d.uvarint(); d.err == nil && v != manFormatVersion {
		return nil, corruptf(object, 0, "unknown manifest version %d", v)
	}
	m := &manifest{}
	m.checkpoint = d.uvarint()
	m.parent = d.uvarint()
	numKG, lo, hi := d.uvarint(), d.uvarint(), d.uvarint()
	flags := d.uvarint()
	m.createdMS = int64(d.uvarint())
	m.epoch = d.uvarint()
	if d.err != nil {
		return nil, corruptf(object, 0, "malformed manifest header")
	}
	if numKG == 0 || numKG > MaxKeyGroups || lo > hi || hi > numKG {
		return nil, corruptf(object, 0, "bad key-group range")
	}
	m.numKG, m.rng, m.savepoint = int(numKG), KeyGroupRange{Lo: int(lo), Hi: int(hi)}, flags&1 != 0
	n := d.uvarint()
	if n > maxManifestSegs || n > uint64(len(d.b)) {
		return nil, corruptf(object, 0, "bad segment count")
	}
	m.segs = make([]segRef, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		var s segRef
		s.name = string(d.bytes(4096))
		s.size, s.metaOff, s.metaLen = int64(d.uvarint()), int64(d.uvarint()), int64(d.uvarint())
		s.kgLo, s.kgHi = int(d.uvarint()), int(d.uvarint())
		s.minKey = d.bytes(maxSegKeyLen)
		s.maxKey = d.bytes(maxSegKeyLen)
		s.count = d.uvarint()
		s.use = KeyGroupRange{Lo: int(d.uvarint()), Hi: int(d.uvarint())}
		if d.err != nil {
			break
		}
		if s.name == "" || s.size < segFooterLen || s.metaOff < 0 || s.metaLen < 4 ||
			s.metaOff+s.metaLen+segFooterLen != s.size || s.kgLo > s.kgHi || s.kgHi >= m.numKG ||
			s.use.Lo > s.use.Hi || s.use.Hi > m.numKG || s.size < 0 {
			return nil, corruptf(object, 0, "bad segment reference %d", i)
		}
		m.segs = append(m.segs, s)
	}
	no := d.uvarint()
	if no > maxOpStates || no > uint64(len(d.b)) {
		return nil, corruptf(object, 0, "bad operator-state count")
	}
	for i := uint64(0); i < no && d.err == nil; i++ {
		name := string(d.bytes(1 << 16))
		data := d.bytes(1 << 31)
		m.opState = append(m.opState, namedBlob{name: name, data: data})
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, corruptf(object, 0, "malformed manifest")
	}
	return m, nil
}

// Object names. All names are relative to the operator's root (see Store.Operator):
//
//	manifests/<checkpoint %020d>/<lo %05d>-<hi %05d>   one per subtask lineage per checkpoint
//	heads/<lo %05d>-<hi %05d>                          lineage head (fencing)
//	segments/<checkpoint %020d>-<lo>-<hi>-<random>.seg segment objects
//	savepoints/<checkpoint %020d>                      marker: never garbage-collect this checkpoint
func manifestName(ckpt uint64, r KeyGroupRange) string {
	return fmt.Sprintf("manifests/%020d/%05d-%05d", ckpt, r.Lo, r.Hi)
}

func headName(r KeyGroupRange) string { return fmt.Sprintf("heads/%05d-%05d", r.Lo, r.Hi) }

func savepointName(ckpt uint64) string { return fmt.Sprintf("savepoints/%020d", ckpt) }

// parseManifestName is the inverse of manifestName on the part after the operator root.
func parseManifestName(name string) (ckpt uint64, r KeyGroupRange, ok bool) {
	rest, found := strings.CutPrefix(name, "manifests/")
	if !found {
		return 0, r, false
	}
	cs, rs, found := strings.Cut(rest, "/")
	if !found {
		return 0, r, false
	}
	c, err := strconv.ParseUint(cs, 10, 64)
	if err != nil {
		return 0, r, false
	}
	ls, hs, found := strings.Cut(rs, "-")
	if !found {
		return 0, r, false
	}
	lo, err1 := strconv.Atoi(ls)
	hi, err2 := strconv.Atoi(hs)
	if err1 != nil || err2 != nil || lo < 0 || hi < lo {
		return 0, r, false
	}
	return c, KeyGroupRange{Lo: lo, Hi: hi}, true
}

// completeCheckpoints returns, newest first, the checkpoints whose manifests together cover
// every key group [0, numKG) without gaps, and for each the manifests that cover it.
func completeCheckpoints(names []string, numKG int) []uint64 {
	by := map[uint64][]KeyGroupRange{}
	for _, n := range names {
		c, r, ok := parseManifestName(n)
		if ok {
			by[c] = append(by[c], r)
		}
	}
	var out []uint64
	for c, rs := range by {
		if covers(rs, KeyGroupRange{Lo: 0, Hi: numKG}) {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] > out[j] })
	return out
}

// covers reports whether the union of rs contains every key group of want.
func covers(rs []KeyGroupRange, want KeyGroupRange) bool {
	rs = append([]KeyGroupRange(nil), rs...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].Lo < rs[j].Lo })
	at := want.Lo
	for _, r := range rs {
		if r.Lo > at {
			break
		}
		at = max(at, r.Hi)
	}
	return at >= want.Hi
}
