package state

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math"
)

// Segment objects: see docs/state-format.md for the byte layout. A segment holds sorted,
// unique durable keys of one subtask's checkpoint delta (or of a compaction), cut into blocks
// that a cold read fetches with one ranged GET each. Its meta section (block index + bloom
// filter) is what a restore loads, lazily, per segment.

const (
	segMagic         = "CLKSEG01"
	segFormatVersion = 1
	segFooterLen     = 32
	maxSegKeyLen     = 1 << 20
	maxSegValueLen   = 1 << 30
	maxSegBlocks     = 1 << 24
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func crc32c(b []byte) uint32 { return crc32.Checksum(b, crcTable) }

// durableKey encodes a key in the durable order: key group, state name, record key, entry.
//
//	u16 BE key group | uvarint len(name) | name | uvarint len(record) | record | entry
func appendDurableKey(dst []byte, kg int, name string, record, entry []byte) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(kg))
	dst = binary.AppendUvarint(dst, uint64(len(name)))
	dst = append(dst, name...)
	dst = binary.AppendUvarint(dst, uint64(len(record)))
	dst = append(dst, record...)
	return append(dst, entry...)
}

func durableKeyGroup(k []byte) int { return int(binary.BigEndian.Uint16(k)) }

// segEntry is one entry written to a segment.
type segEntry struct {
	key   []byte // durable key
	value []byte
	tomb  bool
}

// blockHandle locates one block in a segment.
type blockHandle struct {
	lastKey []byte // largest key in the block
	off     int64
	n       int64 // bytes including the 4-byte trailing checksum
}

// segMeta is the decoded meta section of a segment: what a cold read needs in memory.
type segMeta struct {
	blocks []blockHandle
	bloom  bloom
	count  uint64
}

// segInfo summarises a written segment; it is recorded in the manifest.
type segInfo struct {
	name    string
	size    int64
	metaOff int64
	metaLen int64
	kgLo    int // smallest key group present
	kgHi    int // largest key group present (inclusive)
	minKey  []byte
	maxKey  []byte
	count   uint64
}

// segWriter encodes one segment in memory. Keys must be added in strictly increasing order.
type segWriter struct {
	blockSize   int
	bitsPerKey  int
	buf         bytes.Buffer
	block       []byte
	prevKey     []byte
	blocks      []blockHandle
	hashes      []uint64
	first, last []byte
	n           uint64
}

func newSegWriter(blockSize, bitsPerKey int) *segWriter {
	return &segWriter{blockSize: blockSize, bitsPerKey: bitsPerKey}
}

// add appends an entry. Keys are prefix-compressed against the previous key of the block.
func (w *segWriter) add(e segEntry) {
	shared := 0
	if len(w.block) > 0 {
		for shared < len(e.key) && shared < len(w.prevKey) && e.key[shared] == w.prevKey[shared] {
			shared++
		}
	}
	w.block = binary.AppendUvarint(w.block, uint64(shared))
	w.block = binary.AppendUvarint(w.block, uint64(len(e.key)-shared))
	vl := uint64(len(e.value)) << 1
	if e.tomb {
		vl = 1
	}
	w.block = binary.AppendUvarint(w.block, vl)
	w.block = append(w.block, e.key[shared:]...)
	if !e.tomb {
		w.block = append(w.block, e.value...)
	}
	w.prevKey = append(w.prevKey[:0], e.key...)
	if w.n == 0 {
		w.first = append([]byte(nil), e.key...)
	}
	w.last = append(w.last[:0], e.key...)
	w.hashes = append(w.hashes, hash64(e.key))
	w.n++
	if len(w.block) >= w.blockSize {
		w.flushBlock()
	}
}

func (w *segWriter) size() int { return w.buf.Len() + len(w.block) }

func (w *segWriter) flushBlock() {
	if len(w.block) == 0 {
		return
	}
	off := int64(w.buf.Len())
	w.block = binary.LittleEndian.AppendUint32(w.block, crc32c(w.block))
	w.buf.Write(w.block)
	w.blocks = append(w.blocks, blockHandle{lastKey: append([]byte(nil), w.prevKey...), off: off, n: int64(len(w.block))})
	w.block = w.block[:0]
	w.prevKey = w.prevKey[:0]
}

// finish completes the segment and returns its bytes and summary (name left empty).
func (w *segWriter) finish() ([]byte, segInfo) {
	w.flushBlock()
	bl := newBloom(len(w.hashes), w.bitsPerKey)
	for _, h := range w.hashes {
		bl.add(h)
	}
	metaOff := int64(w.buf.Len())
	meta := encodeSegMeta(nil, w.blocks, bl, w.n)
	w.buf.Write(meta)
	var footer [segFooterLen]byte
	binary.LittleEndian.PutUint64(footer[0:], uint64(metaOff))
	binary.LittleEndian.PutUint64(footer[8:], uint64(len(meta)))
	binary.LittleEndian.PutUint32(footer[16:], segFormatVersion)
	copy(footer[24:], segMagic)
	w.buf.Write(footer[:])
	info := segInfo{
		size: int64(w.buf.Len()), metaOff: metaOff, metaLen: int64(len(meta)),
		minKey: w.first, maxKey: append([]byte(nil), w.last...), count: w.n,
	}
	if w.n > 0 {
		info.kgLo, info.kgHi = durableKeyGroup(w.first), durableKeyGroup(w.last)
	}
	return w.buf.Bytes(), info
}

func encodeSegMeta(dst []byte, blocks []blockHandle, bl bloom, count uint64) []byte {
	start := len(dst)
	dst = binary.AppendUvarint(dst, uint64(len(blocks)))
	for _, b := range blocks {
		dst = binary.AppendUvarint(dst, uint64(len(b.lastKey)))
		dst = append(dst, b.lastKey...)
		dst = binary.AppendUvarint(dst, uint64(b.off))
		dst = binary.AppendUvarint(dst, uint64(b.n))
	}
	dst = binary.AppendUvarint(dst, uint64(bl.k))
	dst = binary.AppendUvarint(dst, uint64(len(bl.bits)))
	dst = append(dst, bl.bits...)
	dst = binary.AppendUvarint(dst, count)
	return binary.LittleEndian.AppendUint32(dst, crc32c(dst[start:]))
}

// decodeSegMeta parses and verifies a meta section. metaOff bounds the block handles.
func decodeSegMeta(object string, b []byte, metaOff int64) (*segMeta, error) {
	if len(b) < 4 {
		return nil, corruptf(object, metaOff, "meta too short")
	}
	body := b[:len(b)-4]
	if crc32c(body) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, corruptf(object, metaOff, "meta checksum mismatch")
	}
	d := decoder{b: body}
	nb := d.uvarint()
	if nb > maxSegBlocks || nb > uint64(len(body)) {
		return nil, corruptf(object, metaOff, "bad block count")
	}
	m := &segMeta{blocks: make([]blockHandle, 0, nb)}
	var end int64
	for i := uint64(0); i < nb && d.err == nil; i++ {
		k := d.bytes(maxSegKeyLen)
		off, n := int64(d.uvarint()), int64(d.uvarint())
		if d.err != nil {
			break
		}
		if off != end || n < 5 || n > metaOff || off+n > metaOff {
			return nil, corruptf(object, metaOff, "bad block handle %d", i)
		}
		if i > 0 && bytes.Compare(k, m.blocks[i-1].lastKey) <= 0 {
			return nil, corruptf(object, metaOff, "block index out of order")
		}
		end = off + n
		m.blocks = append(m.blocks, blockHandle{lastKey: k, off: off, n: n})
	}
	k := d.uvarint()
	bits := d.bytes(1 << 31)
	m.count = d.uvarint()
	if d.err != nil || len(d.b) != 0 {
		return nil, corruptf(object, metaOff, "malformed meta")
	}
	if end != metaOff {
		return nil, corruptf(object, metaOff, "blocks do not cover data")
	}
	if k < 1 || k > 30 || len(bits) == 0 {
		return nil, corruptf(object, metaOff, "bad bloom filter")
	}
	m.bloom = bloom{k: int(k), bits: bits}
	return m, nil
}

// decodeSegFooter parses the fixed footer at the end of a segment.
func decodeSegFooter(object string, b []byte, size int64) (metaOff, metaLen int64, err error) {
	if len(b) != segFooterLen || string(b[24:]) != segMagic {
		return 0, 0, corruptf(object, size-segFooterLen, "bad footer magic")
	}
	if v := binary.LittleEndian.Uint32(b[16:]); v != segFormatVersion {
		return 0, 0, corruptf(object, size-segFooterLen, "unknown segment version %d", v)
	}
	if binary.LittleEndian.Uint32(b[20:]) != 0 {
		return 0, 0, corruptf(object, size-segFooterLen, "reserved footer bytes set")
	}
	metaOff = int64(binary.LittleEndian.Uint64(b[0:]))
	metaLen = int64(binary.LittleEndian.Uint64(b[8:]))
	if metaOff < 0 || metaLen < 4 || metaOff > size || metaLen > size-segFooterLen-metaOff {
		return 0, 0, corruptf(object, size-segFooterLen, "bad footer offsets")
	}
	return metaOff, metaLen, nil
}

// find returns the index of the block that may hold key, or -1.
func (m *segMeta) find(key []byte) int {
	lo, hi := 0, len(m.blocks)
	for lo < hi {
		mid := (lo + hi) / 2
		if bytes.Compare(m.blocks[mid].lastKey, key) < 0 {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == len(m.blocks) {
		return -1
	}
	return lo
}

// blockIter decodes the entries of one verified block.
type blockIter struct {
	object string
	off    int64
	d      decoder
	key    []byte
	value  []byte
	tomb   bool
	err    error
}

// openBlock verifies a block's checksum and returns an iterator over its entries.
func openBlock(object string, off int64, b []byte) (*blockIter, error) {
	if len(b) < 5 {
		return nil, corruptf(object, off, "block too short")
	}
	body := b[:len(b)-4]
	if crc32c(body) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, corruptf(object, off, "block checksum mismatch")
	}
	return &blockIter{object: object, off: off, d: decoder{b: body}}, nil
}

// next advances to the next entry; it returns false at the end or on error (see err).
func (it *blockIter) next() bool {
	if it.err != nil || len(it.d.b) == 0 {
		return false
	}
	shared, unshared, vl := it.d.uvarint(), it.d.uvarint(), it.d.uvarint()
	if it.d.err != nil || shared > uint64(len(it.key)) || unshared > uint64(len(it.d.b)) || shared+unshared > maxSegKeyLen {
		it.err = corruptf(it.object, it.off, "malformed block entry")
		return false
	}
	it.key = append(it.key[:shared], it.d.b[:unshared]...)
	it.d.b = it.d.b[unshared:]
	it.tomb = vl&1 == 1
	it.value = nil
	if !it.tomb {
		n := vl >> 1
		if n > uint64(len(it.d.b)) {
			it.err = corruptf(it.object, it.off, "value overruns block")
			return false
		}
		it.value = it.d.b[:n:n]
		it.d.b = it.d.b[n:]
	} else if vl != 1 {
		it.err = corruptf(it.object, it.off, "bad tombstone")
		return false
	}
	return true
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

// bloom is a split-free bloom filter with double hashing over hash64 of the durable key.
type bloom struct {
	k    int
	bits []byte
}

func newBloom(n, bitsPerKey int) bloom {
	nbits := n * bitsPerKey
	if nbits < 64 {
		nbits = 64
	}
	k := int(math.Round(float64(bitsPerKey) * 0.69))
	k = min(max(k, 1), 30)
	return bloom{k: k, bits: make([]byte, (nbits+7)/8)}
}

func (b bloom) add(h uint64) {
	nbits := uint64(len(b.bits)) * 8
	delta := h>>33 | h<<31
	for i := 0; i < b.k; i++ {
		p := h % nbits
		b.bits[p/8] |= 1 << (p % 8)
		h += delta
	}
}

func (b bloom) mayContain(h uint64) bool {
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
