package format

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

// Manifest is one decoded manifest object.
type Manifest struct {
	Checkpoint uint64
	Parent     uint64 // checkpoint this one is incremental on; 0 for none
	NumKG      int
	Rng        KeyGroupRange // key groups the lineage owns
	Savepoint  bool
	CreatedMS  int64
	Epoch      uint64 // writer epoch of the lineage head when committed
	Segs       []SegRef
	OpState    []NamedBlob // sorted by name
}

// SegRef is a segment as used by a manifest: which key groups of it are live.
type SegRef struct {
	SegInfo
	Use KeyGroupRange // key groups of this segment the manifest reads; ⊆ rng
}

// NamedBlob is one operator-state blob of a manifest.
type NamedBlob struct {
	Name string
	Data []byte
}

// EncodeManifest returns the bytes of m, checksummed.
func EncodeManifest(m *Manifest) []byte {
	b := []byte(manMagic)
	b = binary.AppendUvarint(b, manFormatVersion)
	b = binary.AppendUvarint(b, m.Checkpoint)
	b = binary.AppendUvarint(b, m.Parent)
	b = binary.AppendUvarint(b, uint64(m.NumKG))
	b = binary.AppendUvarint(b, uint64(m.Rng.Lo))
	b = binary.AppendUvarint(b, uint64(m.Rng.Hi))
	var flags uint64
	if m.Savepoint {
		flags |= 1
	}
	b = binary.AppendUvarint(b, flags)
	b = binary.AppendUvarint(b, uint64(m.CreatedMS))
	b = binary.AppendUvarint(b, m.Epoch)
	b = binary.AppendUvarint(b, uint64(len(m.Segs)))
	for _, s := range m.Segs {
		b = appendBytes(b, []byte(s.Name))
		b = binary.AppendUvarint(b, uint64(s.Size))
		b = binary.AppendUvarint(b, uint64(s.MetaOff))
		b = binary.AppendUvarint(b, uint64(s.MetaLen))
		b = binary.AppendUvarint(b, uint64(s.KGLo))
		b = binary.AppendUvarint(b, uint64(s.KGHi))
		b = appendBytes(b, s.MinKey)
		b = appendBytes(b, s.MaxKey)
		b = binary.AppendUvarint(b, s.Count)
		b = binary.AppendUvarint(b, uint64(s.Use.Lo))
		b = binary.AppendUvarint(b, uint64(s.Use.Hi))
	}
	b = binary.AppendUvarint(b, uint64(len(m.OpState)))
	for _, o := range m.OpState {
		b = appendBytes(b, []byte(o.Name))
		b = appendBytes(b, o.Data)
	}
	return binary.LittleEndian.AppendUint32(b, crc32c(b))
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// DecodeManifest parses and verifies a manifest object.
func DecodeManifest(object string, b []byte) (*Manifest, error) {
	if len(b) < len(manMagic)+4 || string(b[:len(manMagic)]) != manMagic {
		return nil, Corruptf(object, 0, "bad manifest magic")
	}
	body := b[:len(b)-4]
	if crc32c(body) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, Corruptf(object, 0, "manifest checksum mismatch")
	}
	d := decoder{b: body[len(manMagic):]}
	if v := d.uvarint(); d.err == nil && v != manFormatVersion {
		return nil, Corruptf(object, 0, "unknown manifest version %d", v)
	}
	m := &Manifest{}
	m.Checkpoint = d.uvarint()
	m.Parent = d.uvarint()
	numKG, lo, hi := d.uvarint(), d.uvarint(), d.uvarint()
	flags := d.uvarint()
	m.CreatedMS = int64(d.uvarint())
	m.Epoch = d.uvarint()
	if d.err != nil {
		return nil, Corruptf(object, 0, "malformed manifest header")
	}
	if numKG == 0 || numKG > MaxKeyGroups || lo > hi || hi > numKG {
		return nil, Corruptf(object, 0, "bad key-group range")
	}
	m.NumKG, m.Rng, m.Savepoint = int(numKG), KeyGroupRange{Lo: int(lo), Hi: int(hi)}, flags&1 != 0
	n := d.uvarint()
	if n > maxManifestSegs || n > uint64(len(d.b)) {
		return nil, Corruptf(object, 0, "bad segment count")
	}
	m.Segs = make([]SegRef, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		var s SegRef
		s.Name = string(d.bytes(4096))
		s.Size, s.MetaOff, s.MetaLen = int64(d.uvarint()), int64(d.uvarint()), int64(d.uvarint())
		s.KGLo, s.KGHi = int(d.uvarint()), int(d.uvarint())
		s.MinKey = d.bytes(maxSegKeyLen)
		s.MaxKey = d.bytes(maxSegKeyLen)
		s.Count = d.uvarint()
		s.Use = KeyGroupRange{Lo: int(d.uvarint()), Hi: int(d.uvarint())}
		if d.err != nil {
			break
		}
		if s.Name == "" || s.Size < SegFooterLen || s.MetaOff < 0 || s.MetaLen < 4 ||
			s.MetaOff+s.MetaLen+SegFooterLen != s.Size || s.KGLo > s.KGHi || s.KGHi >= m.NumKG ||
			s.Use.Lo > s.Use.Hi || s.Use.Hi > m.NumKG || s.Size < 0 {
			return nil, Corruptf(object, 0, "bad segment reference %d", i)
		}
		m.Segs = append(m.Segs, s)
	}
	no := d.uvarint()
	if no > maxOpStates || no > uint64(len(d.b)) {
		return nil, Corruptf(object, 0, "bad operator-state count")
	}
	for i := uint64(0); i < no && d.err == nil; i++ {
		name := string(d.bytes(1 << 16))
		data := d.bytes(1 << 31)
		m.OpState = append(m.OpState, NamedBlob{Name: name, Data: data})
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, Corruptf(object, 0, "malformed manifest")
	}
	return m, nil
}

// Object names. All names are relative to the operator's root (see Store.Operator):
//
//	manifests/<checkpoint %020d>/<lo %05d>-<hi %05d>   one per subtask lineage per checkpoint
//	heads/<lo %05d>-<hi %05d>                          lineage head (fencing)
//	segments/<checkpoint %020d>-<lo>-<hi>-<random>.seg segment objects
//	savepoints/<checkpoint %020d>                      marker: never garbage-collect this checkpoint
//
// ManifestName is the manifest of lineage r in checkpoint ckpt.
func ManifestName(ckpt uint64, r KeyGroupRange) string {
	return fmt.Sprintf("manifests/%020d/%05d-%05d", ckpt, r.Lo, r.Hi)
}

// HeadName is the lineage head of r.
func HeadName(r KeyGroupRange) string { return fmt.Sprintf("heads/%05d-%05d", r.Lo, r.Hi) }

// SavepointName is the savepoint marker of checkpoint ckpt.
func SavepointName(ckpt uint64) string { return fmt.Sprintf("savepoints/%020d", ckpt) }

// ParseManifestName is the inverse of ManifestName on the part after the operator root.
func ParseManifestName(name string) (ckpt uint64, r KeyGroupRange, ok bool) {
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

// CompleteCheckpoints returns, newest first, the checkpoints whose manifests together cover
// every key group [0, numKG) without gaps, and for each the manifests that cover it.
func CompleteCheckpoints(names []string, numKG int) []uint64 {
	by := map[uint64][]KeyGroupRange{}
	for _, n := range names {
		c, r, ok := ParseManifestName(n)
		if ok {
			by[c] = append(by[c], r)
		}
	}
	var out []uint64
	for c, rs := range by {
		if Covers(rs, KeyGroupRange{Lo: 0, Hi: numKG}) {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] > out[j] })
	return out
}

// Covers reports whether the union of rs contains every key group of want.
func Covers(rs []KeyGroupRange, want KeyGroupRange) bool {
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
