package format

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
	w := NewSegWriter(256, 10)
	for i := range n {
		k := AppendDurableKey(nil, i%4, "s", []byte(fmt.Sprintf("r%04d", i)), nil)
		w.Add(SegEntry{Key: k, Value: []byte(fmt.Sprint("v", i)), Tomb: i%7 == 0})
	}
	data, _ := w.Finish()
	return data
}

// decodeWholeSegment decodes every part of a segment as a cold read or compaction would.
func decodeWholeSegment(data []byte) (n int, err error) {
	if len(data) < SegFooterLen {
		return 0, ErrCorrupt
	}
	mo, ml, err := DecodeSegFooter("f", data[len(data)-SegFooterLen:], int64(len(data)))
	if err != nil {
		return 0, err
	}
	m, err := DecodeSegMeta("f", data[mo:mo+ml], mo)
	if err != nil {
		return 0, err
	}
	for _, bh := range m.Blocks {
		it, err := OpenBlock("f", bh.Off, data[bh.Off:bh.Off+bh.N])
		if err != nil {
			return n, err
		}
		for it.Next() {
			n++
		}
		if it.Err != nil {
			return n, it.Err
		}
	}
	return n, nil
}

func FuzzSegmentDecode(f *testing.F) {
	f.Add(sampleSegment(1))
	f.Add(sampleSegment(50))
	f.Add([]byte(SegMagic))
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
	m := &Manifest{Checkpoint: 9, Parent: 8, NumKG: 128, Rng: KeyGroupRange{Lo: 0, Hi: 64}, Epoch: 3,
		OpState: []NamedBlob{{Name: "timers", Data: []byte("t")}}}
	data := sampleSegment(10)
	_, info := func() ([]byte, SegInfo) {
		w := NewSegWriter(256, 10)
		w.Add(SegEntry{Key: []byte{0, 1, 1, 's', 1, 'r'}, Value: []byte("v")})
		return w.Finish()
	}()
	info.Name = "segments/x.seg"
	m.Segs = append(m.Segs, SegRef{SegInfo: info, Use: m.Rng})
	f.Add(EncodeManifest(m))
	f.Add(data)
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeManifest("f", b)
		if err != nil {
			return
		}
		again, err := DecodeManifest("f", EncodeManifest(got))
		if err != nil {
			t.Fatalf("re-encoded manifest does not decode: %v", err)
		}
		if again.Checkpoint != got.Checkpoint || len(again.Segs) != len(got.Segs) || len(again.OpState) != len(got.OpState) {
			t.Fatal("manifest round trip changed it")
		}
	})
}
