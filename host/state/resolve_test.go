package state

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/state/internal/format"
)

// counterBlock encodes n counters under keys user-0 .. user-(n-1) (the benchmark's counter
// state), sorted in the durable order, as one segment of 16 KiB blocks, and returns the
// segment's bytes, its meta and the durable keys in order.
func counterBlock(tb testing.TB, n int) ([]byte, *format.SegMeta, [][]byte) {
	tb.Helper()
	keys := make([][]byte, n)
	for i := range keys {
		rec := []byte("user-" + strconv.Itoa(i))
		keys[i] = format.AppendDurableKey(nil, KeyGroupOf(rec, 128), "count", rec, nil)
	}
	slices.SortFunc(keys, bytes.Compare)
	w := format.NewSegWriter(16<<10, 10)
	for i, k := range keys {
		w.Add(format.SegEntry{Key: k, Value: binary.LittleEndian.AppendUint64(nil, uint64(i))})
	}
	data, info := w.Finish()
	m, err := format.DecodeSegMeta("seg", data[info.MetaOff:info.MetaOff+info.MetaLen], info.MetaOff)
	if err != nil {
		tb.Fatal(err)
	}
	return data, m, keys
}

// TestResolveBlock checks resolveBlock against a plain walk of the block: every key asked for
// is answered with its value if the block holds it, and absent ones (between, before and after
// the block's keys, and prefixes of its keys) are not found.
func TestResolveBlock(t *testing.T) {
	data, m, keys := counterBlock(t, 20_000)
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		bi := rng.IntN(len(m.Blocks))
		bh := m.Blocks[bi]
		block := data[bh.Off : bh.Off+bh.N]
		it, err := format.OpenBlock("seg", bh.Off, block)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string][]byte{}
		var in [][]byte
		for it.Next() {
			want[string(it.Key)] = bytes.Clone(it.Value)
			in = append(in, bytes.Clone(it.Key))
		}
		// Asked: some of the block's keys, keys just beside them (absent), prefixes, and keys
		// of other blocks.
		var ask [][]byte
		for range 1 + rng.IntN(60) {
			k := in[rng.IntN(len(in))]
			switch rng.IntN(5) {
			case 0:
				ask = append(ask, append(bytes.Clone(k), 0))
			case 1:
				ask = append(ask, k[:len(k)-1])
			case 2:
				ask = append(ask, keys[rng.IntN(len(keys))])
			default:
				ask = append(ask, k)
			}
		}
		slices.SortFunc(ask, bytes.Compare)
		ask = slices.CompactFunc(ask, bytes.Equal)
		rs := make([]*fetchReq, len(ask))
		out := make([]Fetched, len(ask))
		for i, k := range ask {
			rs[i] = &fetchReq{idx: i, dk: k}
		}
		if err := resolveBlock("seg", bh, block, rs, out); err != nil {
			t.Fatal(err)
		}
		for i, k := range ask {
			v, ok := want[string(k)]
			if rs[i].done != ok || out[i].Found != ok || !bytes.Equal(out[i].Value, v) {
				t.Fatalf("round %d, key %q: hit %v found %v value %x, want %v %x", round, k, rs[i].done, out[i].Found, out[i].Value, ok, v)
			}
		}
	}
}

// BenchmarkResolveBlock resolves 34 sorted keys in one 16 KiB block of counters (issue 10's
// long Zipf run: 145k keys over 4,205 blocks), the lookup's walk of a block once its GET is in.
func BenchmarkResolveBlock(b *testing.B) {
	data, m, _ := counterBlock(b, 100_000)
	rng := rand.New(rand.NewPCG(5, 6))
	type job struct {
		bh   format.BlockHandle
		keys [][]byte
	}
	jobs := make([]job, 64)
	for i := range jobs {
		bh := m.Blocks[rng.IntN(len(m.Blocks)-1)]
		it, err := format.OpenBlock("seg", bh.Off, data[bh.Off:bh.Off+bh.N])
		if err != nil {
			b.Fatal(err)
		}
		var in [][]byte
		for it.Next() {
			in = append(in, bytes.Clone(it.Key))
		}
		var ks [][]byte
		for _, j := range rng.Perm(len(in))[:34] {
			ks = append(ks, in[j])
		}
		slices.SortFunc(ks, bytes.Compare)
		jobs[i] = job{bh, ks}
	}
	reqs := make([]fetchReq, 34)
	rs := make([]*fetchReq, 34)
	out := make([]Fetched, 34)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		j := jobs[i%len(jobs)]
		for k := range rs {
			reqs[k] = fetchReq{idx: k, dk: j.keys[k]}
			rs[k] = &reqs[k]
		}
		if err := resolveBlock("seg", j.bh, data[j.bh.Off:j.bh.Off+j.bh.N], rs, out); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/34, "ns/key")
}
