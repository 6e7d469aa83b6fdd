package format

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"
)

// seekLinear is what Seek must agree with: the first entry at or after it whose key is at least
// key, found by comparing every key.
func seekLinear(it *BlockIter, key []byte) bool {
	if !it.valid && !it.Next() {
		return false
	}
	for bytes.Compare(it.Key, key) < 0 {
		if !it.Next() {
			return false
		}
	}
	return true
}

// checkSeeks seeks the sorted keys through body (a block's entries, checksum left out) with Seek
// and with seekLinear, and fails at the first difference.
func checkSeeks(t *testing.T, body []byte, keys [][]byte) {
	t.Helper()
	a := &BlockIter{object: "f", d: decoder{b: body}}
	b := &BlockIter{object: "f", d: decoder{b: body}}
	for _, k := range keys {
		okA, okB := a.Seek(k), seekLinear(b, k)
		if okA != okB || okA && (!bytes.Equal(a.Key, b.Key) || !bytes.Equal(a.Value, b.Value) || a.Tomb != b.Tomb) || (a.Err == nil) != (b.Err == nil) {
			t.Fatalf("Seek(%q): %v %q %q %v, a linear walk %v %q %q %v", k, okA, a.Key, a.Value, a.Err, okB, b.Key, b.Value, b.Err)
		}
		if !okA {
			return
		}
	}
}

// encodeEntries writes entries as a block's body, stating shared prefixes up to the longest
// (a writer may state a shorter one: Seek must not rely on it being the longest).
func encodeEntries(rng *rand.Rand, keys [][]byte, longest bool) []byte {
	var body, prev []byte
	for i, k := range keys {
		shared := 0
		for shared < len(k) && shared < len(prev) && k[shared] == prev[shared] {
			shared++
		}
		if !longest && shared > 0 {
			shared = rng.IntN(shared + 1)
		}
		body = binary.AppendUvarint(body, uint64(shared))
		body = binary.AppendUvarint(body, uint64(len(k)-shared))
		body = binary.AppendUvarint(body, uint64(2*(i%3)))
		body = append(body, k[shared:]...)
		body = append(body, bytes.Repeat([]byte{byte(i)}, i%3)...)
		prev = k
	}
	return body
}

func randomKeys(rng *rand.Rand, n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		k := make([]byte, rng.IntN(6))
		for j := range k {
			k[j] = byte('a' + rng.IntN(3)) // a small alphabet: many shared prefixes
		}
		keys[i] = k
	}
	slices.SortFunc(keys, bytes.Compare)
	return slices.CompactFunc(keys, bytes.Equal)
}

// TestSeek compares Seek with a linear walk over sorted blocks, with the longest shared
// prefixes and with shorter ones, for sorted keys that are in the block, between its keys,
// prefixes of them and beyond them.
func TestSeek(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		in := randomKeys(rng, 1+rng.IntN(40))
		ask := randomKeys(rng, 1+rng.IntN(20))
		checkSeeks(t, encodeEntries(rng, in, rng.IntN(2) == 0), ask)
	}
}

// FuzzSeek: on any bytes (a corrupt block, or unsorted keys), Seek finds what a linear walk
// does.
func FuzzSeek(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	f.Add(encodeEntries(rng, randomKeys(rng, 20), true), []byte("ab\x00b\x00c"))
	f.Add(encodeEntries(rng, randomKeys(rng, 20), false), []byte("a\x00aab"))
	f.Fuzz(func(t *testing.T, body, ask []byte) {
		keys := bytes.Split(ask, []byte{0})
		slices.SortFunc(keys, bytes.Compare)
		checkSeeks(t, body, keys)
	})
}

func TestDurableKeyLen(t *testing.T) {
	for _, n := range []int{0, 1, 127, 128, 300, 20000} {
		rec := bytes.Repeat([]byte("r"), n)
		name := string(bytes.Repeat([]byte("s"), n/2))
		if got, want := DurableKeyLen(name, rec, []byte("e")), len(AppendDurableKey(nil, 7, name, rec, []byte("e"))); got != want {
			t.Fatalf("DurableKeyLen of a %d-byte key = %d, want %d", n, got, want)
		}
	}
}
