package state

import (
	"bytes"
	"fmt"
	"testing"
)

// Run each for a few minutes:
//
//	go test -run '^$' -fuzz FuzzSegmentDecode -fuzztime 2m ./host/state/
//	go test -run '^$' -fuzz FuzzManifestDecode -fuzztime 2m ./host/state/

func sampleSegment(n int) []byte {
	w := newSegWriter(256, 10)
	for i := range n {
		k := appendDurableKey(nil, i%4, "s", []byte(fmt.Sprintf("r%04d", i)), nil)
		w.add(segEntry{key: k, value: []byte(fmt.Sprint("v", i)), tomb: i%7 == 0})
	}
	data, _ := w.finish()
	return data
}

// decodeWholeSegment decodes every part of a segment as a cold read or compaction would.
func decodeWholeSegment(data []byte) (n int, err error) {
	if len(data) < segFooterLen {
		return 0, ErrCorrupt
	}
	mo, ml, err := decodeSegFooter("f", data[len(data)-segFooterLen:], int64(len(data)))
	if err != nil {
		return 0, err
	}
	m, err := decodeSegMeta("f", data[mo:mo+ml], mo)
	if err != nil {
		return 0, err
	}
	for _, bh := range m.blocks {
		it, err := openBlock("f", bh.off, data[bh.off:bh.off+bh.n])
		if err != nil {
			return n, err
		}
		for it.next() {
			n++
		}
		if it.err != nil {
			return n, it.err
		}
	}
	return n, nil
}

func FuzzSegmentDecode(f *testing.F) {
	f.Add(sampleSegment(1))
	f.Add(sampleSegment(50))
	f.Add([]byte(segMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := decodeWholeSegment(data)
		if err == nil && n < 0 {
			t.Fatal("negative count")
		}
		// Any single corrupted byte of a valid segment is detected (checksums) or harmless.
		if len(data) > 0 {
			good := sampleSegment(20)
			i := int(data[0]) * len(good) / 256
			bad := bytes.Clone(good)
			bad[i] ^= 1 | data[len(data)-1]
			if _, err := decodeWholeSegment(bad); err == nil {
				t.Fatalf("flipping byte %d of %d went undetected", i, len(good))
			}
		}
	})
}

func FuzzManifestDecode(f *testing.F) {
	m := &manifest{checkpoint: 9, parent: 8, numKG: 128, rng: KeyGroupRange{Lo: 0, Hi: 64}, epoch: 3,
		opState: []namedBlob{{name: "timers", data: []byte("t")}}}
	data := sampleSegment(10)
	_, info := func() ([]byte, segInfo) {
		w := newSegWriter(256, 10)
		w.add(segEntry{key: []byte{0, 1, 1, 's', 1, 'r'}, value: []byte("v")})
		return w.finish()
	}()
	info.name = "segments/x.seg"
	m.segs = append(m.segs, segRef{segInfo: info, use: m.rng})
	f.Add(encodeManifest(m))
	f.Add(data)
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeManifest("f", b)
		if err != nil {
			return
		}
		again, err := decodeManifest("f", encodeManifest(got))
		if err != nil {
			t.Fatalf("re-encoded manifest does not decode: %v", err)
		}
		if again.checkpoint != got.checkpoint || len(again.segs) != len(got.segs) || len(again.opState) != len(got.opState) {
			t.Fatal("manifest round trip changed it")
		}
	})
}
