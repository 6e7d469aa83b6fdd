package format

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math"
	"slices"
)

// Segment objects: see docs/state-format.md for the byte layout. A segment holds sorted,
// unique durable keys of one subtask's checkpoint delta (or of a compaction), cut into blocks
// that a cold read fetches with one ranged GET each. Its meta section (block index + bloom
// filter) is what a restore loads, lazily, per segment.

const (
	SegMagic         = "CLKSEG01"
	segFormatVersion = 1
	SegFooterLen     = 32
	maxSegKeyLen     = 1 << 20
	maxSegValueLen   = 1 << 30
	maxSegBlocks     = 1 << 24
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func crc32c(b []byte) uint32 { return crc32.Checksum(b, crcTable) }

// AppendDurableKey encodes a key in the durable order: key group, state name, record key, entry.
//
//	u16 BE key group | uvarint len(name) | name | uvarint len(record) | record | entry
func AppendDurableKey(dst []byte, kg int, name string, record, entry []byte) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(kg))
	dst = binary.AppendUvarint(dst, uint64(len(name)))
	dst = append(dst, name...)
	dst = binary.AppendUvarint(dst, uint64(len(record)))
	dst = append(dst, record...)
	return append(dst, entry...)
}

// DurableKeyLen is the length of AppendDurableKey's encoding.
func DurableKeyLen(name string, record, entry []byte) int {
	return 2 + uvarintLen(uint64(len(name))) + len(name) + uvarintLen(uint64(len(record))) + len(record) + len(entry)
}

func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// DurableKeyGroup returns the key group of durable key k.
func DurableKeyGroup(k []byte) int { return int(binary.BigEndian.Uint16(k)) }

// SegEntry is one entry written to a segment.
type SegEntry struct {
	Key   []byte // durable key
	Value []byte
	Tomb  bool
}

// BlockHandle locates one block in a segment.
type BlockHandle struct {
	LastKey []byte // largest key in the block
	Off     int64
	N       int64 // bytes including the 4-byte trailing checksum
}

// SegMeta is the decoded meta section of a segment: what a cold read needs in memory.
type SegMeta struct {
	Blocks []BlockHandle
	Bloom  Bloom
	Count  uint64
}

// SegInfo summarises a written segment; it is recorded in the manifest.
type SegInfo struct {
	Name    string
	Size    int64
	MetaOff int64
	MetaLen int64
	KGLo    int // smallest key group present
	KGHi    int // largest key group present (inclusive)
	MinKey  []byte
	MaxKey  []byte
	Count   uint64
}

// SegWriter encodes one segment in memory. Keys must be added in strictly increasing order.
type SegWriter struct {
	blockSize   int
	bitsPerKey  int
	buf         bytes.Buffer
	block       []byte
	prevKey     []byte
	blocks      []BlockHandle
	hashes      []uint64
	first, last []byte
	n           uint64
}

func NewSegWriter(blockSize, bitsPerKey int) *SegWriter {
	return &SegWriter{blockSize: blockSize, bitsPerKey: bitsPerKey}
}

// Reserve sizes the writer for about size bytes of segment and keys entries, so that neither its
// buffer nor its key hashes grow by doubling.
func (w *SegWriter) Reserve(size, keys int) {
	w.buf.Grow(size)
	if keys > cap(w.hashes)-len(w.hashes) {
		w.hashes = slices.Grow(w.hashes, keys)
	}
}

// Add appends an entry. Keys are prefix-compressed against the previous key of the block.
func (w *SegWriter) Add(e SegEntry) {
	shared := 0
	if len(w.block) > 0 {
		for shared < len(e.Key) && shared < len(w.prevKey) && e.Key[shared] == w.prevKey[shared] {
			shared++
		}
	}
	w.block = binary.AppendUvarint(w.block, uint64(shared))
	w.block = binary.AppendUvarint(w.block, uint64(len(e.Key)-shared))
	vl := uint64(len(e.Value)) << 1
	if e.Tomb {
		vl = 1
	}
	w.block = binary.AppendUvarint(w.block, vl)
	w.block = append(w.block, e.Key[shared:]...)
	if !e.Tomb {
		w.block = append(w.block, e.Value...)
	}
	w.prevKey = append(w.prevKey[:0], e.Key...)
	if w.n == 0 {
		w.first = append([]byte(nil), e.Key...)
	}
	w.last = append(w.last[:0], e.Key...)
	w.hashes = append(w.hashes, Hash64(e.Key))
	w.n++
	if len(w.block) >= w.blockSize {
		w.flushBlock()
	}
}

// Len returns the number of entries added.
func (w *SegWriter) Len() uint64 { return w.n }

// Hashes returns Hash64 of every key added, in order: what the segment's filter holds. It
// aliases the writer's memory.
func (w *SegWriter) Hashes() []uint64 { return w.hashes }

// Size returns the encoded size so far.
func (w *SegWriter) Size() int { return w.buf.Len() + len(w.block) }

func (w *SegWriter) flushBlock() {
	if len(w.block) == 0 {
		return
	}
	off := int64(w.buf.Len())
	w.block = binary.LittleEndian.AppendUint32(w.block, crc32c(w.block))
	w.buf.Write(w.block)
	w.blocks = append(w.blocks, BlockHandle{LastKey: append([]byte(nil), w.prevKey...), Off: off, N: int64(len(w.block))})
	w.block = w.block[:0]
	w.prevKey = w.prevKey[:0]
}

// Finish completes the segment and returns its bytes and summary (name left empty).
func (w *SegWriter) Finish() ([]byte, SegInfo) {
	w.flushBlock()
	bl := newBloom(len(w.hashes), w.bitsPerKey)
	for _, h := range w.hashes {
		bl.add(h)
	}
	metaOff := int64(w.buf.Len())
	meta := encodeSegMeta(nil, w.blocks, bl, w.n)
	w.buf.Write(meta)
	var footer [SegFooterLen]byte
	binary.LittleEndian.PutUint64(footer[0:], uint64(metaOff))
	binary.LittleEndian.PutUint64(footer[8:], uint64(len(meta)))
	binary.LittleEndian.PutUint32(footer[16:], segFormatVersion)
	copy(footer[24:], SegMagic)
	w.buf.Write(footer[:])
	info := SegInfo{
		Size: int64(w.buf.Len()), MetaOff: metaOff, MetaLen: int64(len(meta)),
		MinKey: w.first, MaxKey: append([]byte(nil), w.last...), Count: w.n,
	}
	if w.n > 0 {
		info.KGLo, info.KGHi = DurableKeyGroup(w.first), DurableKeyGroup(w.last)
	}
	return w.buf.Bytes(), info
}

func encodeSegMeta(dst []byte, blocks []BlockHandle, bl Bloom, count uint64) []byte {
	start := len(dst)
	dst = binary.AppendUvarint(dst, uint64(len(blocks)))
	for _, b := range blocks {
		dst = binary.AppendUvarint(dst, uint64(len(b.LastKey)))
		dst = append(dst, b.LastKey...)
		dst = binary.AppendUvarint(dst, uint64(b.Off))
		dst = binary.AppendUvarint(dst, uint64(b.N))
	}
	dst = binary.AppendUvarint(dst, uint64(bl.k))
	dst = binary.AppendUvarint(dst, uint64(len(bl.bits)))
	dst = append(dst, bl.bits...)
	dst = binary.AppendUvarint(dst, count)
	return binary.LittleEndian.AppendUint32(dst, crc32c(dst[start:]))
}

// DecodeSegMeta parses and verifies a meta section. metaOff bounds the block handles.
func DecodeSegMeta(object string, b []byte, metaOff int64) (*SegMeta, error) {
	if len(b) < 4 {
		return nil, Corruptf(object, metaOff, "meta too short")
	}
	body := b[:len(b)-4]
	if crc32c(body) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, Corruptf(object, metaOff, "meta checksum mismatch")
	}
	d := decoder{b: body}
	nb := d.uvarint()
	if nb > maxSegBlocks || nb > uint64(len(body)) {
		return nil, Corruptf(object, metaOff, "bad block count")
	}
	m := &SegMeta{Blocks: make([]BlockHandle, 0, nb)}
	var end int64
	for i := uint64(0); i < nb && d.err == nil; i++ {
		k := d.bytes(maxSegKeyLen)
		off, n := int64(d.uvarint()), int64(d.uvarint())
		if d.err != nil {
			break
		}
		if off != end || n < 5 || n > metaOff || off+n > metaOff {
			return nil, Corruptf(object, metaOff, "bad block handle %d", i)
		}
		if i > 0 && bytes.Compare(k, m.Blocks[i-1].LastKey) <= 0 {
			return nil, Corruptf(object, metaOff, "block index out of order")
		}
		end = off + n
		m.Blocks = append(m.Blocks, BlockHandle{LastKey: k, Off: off, N: n})
	}
	k := d.uvarint()
	bits := d.bytes(1 << 31)
	m.Count = d.uvarint()
	if d.err != nil || len(d.b) != 0 {
		return nil, Corruptf(object, metaOff, "malformed meta")
	}
	if end != metaOff {
		return nil, Corruptf(object, metaOff, "blocks do not cover data")
	}
	if k < 1 || k > 30 || len(bits) == 0 {
		return nil, Corruptf(object, metaOff, "bad bloom filter")
	}
	m.Bloom = Bloom{k: int(k), bits: bits}
	return m, nil
}

// DecodeSegFooter parses the fixed footer at the end of a segment.
func DecodeSegFooter(object string, b []byte, size int64) (metaOff, metaLen int64, err error) {
	if len(b) != SegFooterLen || string(b[24:]) != SegMagic {
		return 0, 0, Corruptf(object, size-SegFooterLen, "bad footer magic")
	}
	if v := binary.LittleEndian.Uint32(b[16:]); v != segFormatVersion {
		return 0, 0, Corruptf(object, size-SegFooterLen, "unknown segment version %d", v)
	}
	if binary.LittleEndian.Uint32(b[20:]) != 0 {
		return 0, 0, Corruptf(object, size-SegFooterLen, "reserved footer bytes set")
	}
	metaOff = int64(binary.LittleEndian.Uint64(b[0:]))
	metaLen = int64(binary.LittleEndian.Uint64(b[8:]))
	if metaOff < 0 || metaLen < 4 || metaOff > size || metaLen > size-SegFooterLen-metaOff {
		return 0, 0, Corruptf(object, size-SegFooterLen, "bad footer offsets")
	}
	return metaOff, metaLen, nil
}

// Find returns the index of the block that may hold key, or -1.
func (m *SegMeta) Find(key []byte) int {
	lo, hi := 0, len(m.Blocks)
	for lo < hi {
		mid := (lo + hi) / 2
		if bytes.Compare(m.Blocks[mid].LastKey, key) < 0 {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == len(m.Blocks) {
		return -1
	}
	return lo
}

// BlockIter decodes the entries of one verified block.
type BlockIter struct {
	object string
	off    int64
	d      decoder
	Key    []byte
	Value  []byte
	Tomb   bool
	Err    error
	valid  bool // Key, Value and Tomb are an entry's (Next or Seek returned true)
}

// OpenBlock verifies a block's checksum and returns an iterator over its entries.
func OpenBlock(object string, off int64, b []byte) (*BlockIter, error) {
	if len(b) < 5 {
		return nil, Corruptf(object, off, "block too short")
	}
	body := b[:len(b)-4]
	if crc32c(body) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, Corruptf(object, off, "block checksum mismatch")
	}
	return &BlockIter{object: object, off: off, d: decoder{b: body}}, nil
}

// OpenVerifiedBlock returns an iterator over the entries of a block whose checksum OpenBlock
// has verified already (the same bytes, kept since): a cold read verifies a block as its GET
// arrives and walks it later, and a second checksum of 16 KiB cost more than the walk of the
// few keys asked of it.
func OpenVerifiedBlock(object string, off int64, b []byte) (*BlockIter, error) {
	if len(b) < 5 {
		return nil, Corruptf(object, off, "block too short")
	}
	return &BlockIter{object: object, off: off, d: decoder{b: b[:len(b)-4]}}, nil
}

// Next advances to the next entry; it returns false at the end or on error (see Err).
func (it *BlockIter) Next() bool {
	it.valid = false
	if it.Err != nil || len(it.d.b) == 0 {
		return false
	}
	rest, key, value, _, tomb, bad := decodeEntry(it.d.b, it.Key)
	if bad != "" {
		it.Err = Corruptf(it.object, it.off, "%s", bad)
		return false
	}
	it.d.b, it.Key, it.Value, it.Tomb, it.valid = rest, key, value, tomb, true
	return true
}

// decodeEntry decodes the entry at the start of b, whose key shares a stated prefix with key
// (the previous entry's, whose buffer it reuses), and returns the bytes after it, its key, its
// value, the stated shared prefix's length and whether it is a tombstone; bad says what is
// malformed, if anything.
//
// It takes and returns the walk's state by value, and the walks (Next, Seek) keep it in their
// own frames and store it in the iterator once: a pointer stored into the heap-allocated
// iterator takes a GC write barrier while a collection marks, and a walk that stored its
// state every entry (five pointers) spent 4-5% of a cold read's CPU in a busy run on those
// barriers and their buffer flushes.
func decodeEntry(b, key []byte) (rest, nkey, value []byte, shared int, tomb bool, bad string) {
	var sh, unshared, vl uint64
	if len(b) >= 3 && b[0]|b[1]|b[2] < 0x80 {
		// Three one-byte lengths: nearly every entry of a block of small values.
		sh, unshared, vl = uint64(b[0]), uint64(b[1]), uint64(b[2])
		b = b[3:]
	} else {
		var n1, n2, n3 int
		sh, n1 = binary.Uvarint(b)
		if n1 > 0 {
			unshared, n2 = binary.Uvarint(b[n1:])
			if n2 > 0 {
				vl, n3 = binary.Uvarint(b[n1+n2:])
			}
		}
		if n1 <= 0 || n2 <= 0 || n3 <= 0 {
			return nil, key, nil, 0, false, "malformed block entry"
		}
		b = b[n1+n2+n3:]
	}
	if sh > uint64(len(key)) || unshared > uint64(len(b)) || sh+unshared > maxSegKeyLen {
		return nil, key, nil, 0, false, "malformed block entry"
	}
	if k := key[:sh]; unshared <= 8 && cap(k)-len(k) >= int(unshared) {
		// A few bytes, copied in place: a call of memmove costs more than they do.
		k = k[:sh+unshared]
		for i, c := range b[:unshared] {
			k[int(sh)+i] = c
		}
		key = k
	} else {
		key = append(key[:sh], b[:unshared]...)
	}
	b = b[unshared:]
	if vl&1 == 1 {
		if vl != 1 {
			return nil, key, nil, 0, false, "bad tombstone"
		}
		return b, key, nil, int(sh), true, ""
	}
	n := vl >> 1
	if n > uint64(len(b)) {
		return nil, key, nil, 0, false, "value overruns block"
	}
	return b[n:], key, b[:n:n], int(sh), false, ""
}

// Seek moves to the first entry, at or after the current one (or the first, before any Next),
// whose key is at least key, and reports whether there is one (it.Key, it.Value and it.Tomb are
// then its; false at the end of the block or on error, see Err). Seeks of keys in increasing
// order walk the block once, as Next does.
//
// Most entries are passed without comparing keys. m is the length of the prefix the current
// key shares with key, and the current key is less than key: either it differs from key at m
// by a smaller byte, and an entry that shares more than m bytes with it has that byte too, so
// it is less than key as well; or it ends at m, and no entry shares more than m bytes with it.
// Only an entry that shares at most m bytes is compared, from its shared prefix on. This holds
// for any shared prefix the writer states, longest or not.
func (it *BlockIter) Seek(key []byte) bool {
	if !it.valid && !it.Next() {
		return false
	}
	b, cur, value, tomb := it.d.b, it.Key, it.Value, it.Tomb
	found, bad := false, ""
	m := commonPrefix(cur, key, 0)
	for {
		if m == len(key) || m < len(cur) && cur[m] > key[m] {
			found = true // cur >= key
			break
		}
		if len(b) == 0 {
			break
		}
		var shared int
		b, cur, value, shared, tomb, bad = decodeEntry(b, cur)
		if bad != "" {
			break
		}
		if shared > m {
			continue // cur[m] is the previous key's, below key[m]
		}
		m = commonPrefix(cur, key, shared)
	}
	it.d.b, it.Key, it.Value, it.Tomb, it.valid = b, cur, value, tomb, found
	if bad != "" {
		it.Err = Corruptf(it.object, it.off, "%s", bad)
	}
	return found
}

// commonPrefix returns the length of the longest common prefix of a and b, which share their
// first from bytes.
func commonPrefix(a, b []byte, from int) int {
	n := min(len(a), len(b))
	for from < n && a[from] == b[from] {
		from++
	}
	return from
}

// decoder reads uvarints and length-prefixed bytes, remembering the first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) > 0 && d.b[0] < 0x80 { // one byte: nearly every length in a block
		v := uint64(d.b[0])
		d.b = d.b[1:]
		return v
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = ErrCorrupt
		d.b = nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(limit uint64) []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > limit || n > uint64(len(d.b)) {
		d.err = ErrCorrupt
		d.b = nil
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// Bloom is a split-free bloom filter with double hashing over Hash64 of the durable key.
type Bloom struct {
	k    int
	bits []byte
}

func newBloom(n, bitsPerKey int) Bloom {
	nbits := n * bitsPerKey
	if nbits < 64 {
		nbits = 64
	}
	k := int(math.Round(float64(bitsPerKey) * 0.69))
	k = min(max(k, 1), 30)
	return Bloom{k: k, bits: make([]byte, (nbits+7)/8)}
}

// NewBloom returns an empty filter sized for n keys at bitsPerKey bits each, as a segment's.
func NewBloom(n, bitsPerKey int) Bloom { return newBloom(n, bitsPerKey) }

// Add adds h, a Hash64, to the filter.
func (b Bloom) Add(h uint64) { b.add(h) }

// Clone returns a copy of the filter that Add can change without changing b.
func (b Bloom) Clone() Bloom { return Bloom{k: b.k, bits: slices.Clone(b.bits)} }

// Bytes returns the filter's size in memory.
func (b Bloom) Bytes() int { return len(b.bits) }

func (b Bloom) add(h uint64) {
	nbits := uint64(len(b.bits)) * 8
	delta := h>>33 | h<<31
	for i := 0; i < b.k; i++ {
		p := h % nbits
		b.bits[p/8] |= 1 << (p % 8)
		h += delta
	}
}

func (b Bloom) MayContain(h uint64) bool {
	nbits := uint64(len(b.bits)) * 8
	if nbits == 0 {
		return true
	}
	delta := h>>33 | h<<31
	for i := 0; i < b.k; i++ {
		p := h % nbits
		if b.bits[p/8]&(1<<(p%8)) == 0 {
			return false
		}
		h += delta
	}
	return true
}
