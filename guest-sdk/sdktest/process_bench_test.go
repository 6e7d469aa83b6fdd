package sdktest

import (
	"bytes"
	"context"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/jsonx"
	"github.com/clink-wasm/clink-wasm/host/abi"
)

// leanHandler is the cheapest Handler that runs a counter: one map of per-key values, emits
// counted and dropped. With it, what differs between the variants of BenchmarkCounter is the
// guest code and the ABI traffic it causes, not the state tier or the output path.
type leanHandler struct {
	key   []byte
	state map[string][]byte
	emits int
}

func (h *leanHandler) Get(_ uint32, _ []byte) ([]byte, bool, error) {
	v, ok := h.state[string(h.key)]
	return v, ok, nil
}

func (h *leanHandler) Put(_ uint32, _, v []byte) error {
	if old, ok := h.state[string(h.key)]; ok && len(old) == len(v) {
		copy(old, v)
		return nil
	}
	h.state[string(h.key)] = bytes.Clone(v)
	return nil
}

func (h *leanHandler) Delete(uint32, []byte) error { delete(h.state, string(h.key)); return nil }
func (h *leanHandler) Emit(_, _ []byte) error      { h.emits++; return nil }
func (h *leanHandler) RegisterTimer(int64) error   { return nil }
func (h *leanHandler) DeleteTimer(int64) error     { return nil }
func (h *leanHandler) Watermark() int64            { return math.MinInt64 }
func (h *leanHandler) Log(abi.LogLevel, []byte)    {}
func (h *leanHandler) SetResumeOrder(int64)        {}
func (h *leanHandler) Lookup(uint32, []byte) (int, []byte, error) {
	return 0, nil, abi.LookupUnavailable
}

type counterRecord struct{ key, value []byte }

func counterRecords(n, keys int) []counterRecord {
	recs := make([]counterRecord, n)
	for i := range recs {
		k := "user-" + strconv.Itoa((i*7919)%keys)
		recs[i] = counterRecord{[]byte(k), []byte(`{"user":"` + k + `","page":"/checkout","n":` + strconv.Itoa(i) + `}`)}
	}
	return recs
}

// runWasm runs recs through one instance of m and returns the time per record.
func runWasm(b *testing.B, m *abi.Module, recs []counterRecord, valuePrefix byte) float64 {
	h := &leanHandler{state: map[string][]byte{}}
	in, err := m.Instantiate(context.Background(), h)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close(context.Background())
	start := time.Now()
	for _, r := range recs {
		h.key = r.key
		v := r.value
		if valuePrefix != 0 {
			v[0] = valuePrefix
		}
		if err := in.Process(r.key, v, 0); err != nil {
			b.Fatal(err)
		}
		if valuePrefix != 0 {
			v[0] = '{'
		}
	}
	if h.emits != len(recs) {
		b.Fatalf("%d emits for %d records", h.emits, len(recs))
	}
	return float64(time.Since(start).Nanoseconds()) / float64(len(recs))
}

// runNative is the counter example as plain Go over the same kind of map: the baseline for
// "what does running it as WebAssembly cost".
func runNative(recs []counterRecord) float64 {
	h := &leanHandler{state: map[string][]byte{}}
	var js []byte
	var num [8]byte
	start := time.Now()
	for _, r := range recs {
		h.key = r.key
		var n int64
		if v, ok, _ := h.Get(0, nil); ok && len(v) == 8 {
			n = clink.Int64(v)
		}
		n++
		clink.PutInt64(num[:], n)
		h.Put(0, nil, num[:])
		js = append(js[:0], `{"key":`...)
		js = jsonx.AppendString(js, r.key)
		js = append(js, `,"count":`...)
		js = jsonx.AppendInt(js, n)
		js = append(js, '}')
		h.Emit(r.key, js)
	}
	return float64(time.Since(start).Nanoseconds()) / float64(len(recs))
}

// BenchmarkCounter runs the counter example natively and as each built module in the
// production host (host/abi, lean handler), alternating the order round by round, and reports
// the median time per record and the median throughput ratio to native Go of each:
//
//	go test ./guest-sdk/sdktest -run '^$' -bench Counter -benchtime 1x
//
// wat is host/abi/testdata/counter.wasm, a hand-written counter that makes the three import
// calls (get_async, put, emit) per record; wat-fast is host/abi/testdata/fast.wasm, which does
// the same through a prefetch frame and the output area with no import call: the floors for
// each way of talking to the host.
func BenchmarkCounter(b *testing.B) {
	variants := []struct {
		name   string
		path   string
		prefix byte // replaces the value's first byte: fast.wasm takes its command from it
	}{
		{"wat", "../../host/abi/testdata/counter.wasm", 0},
		{"wat-fast", "../../host/abi/testdata/fast.wasm", 'c'},
		{"as", examplesDir + "/counter/counter-as.wasm", 0},
		{"go", examplesDir + "/counter/counter-go.wasm", 0},
		{"c", examplesDir + "/counter/counter-c.wasm", 0},
		{"rust", examplesDir + "/counter/counter-rust.wasm", 0},
	}
	mods := make([]*abi.Module, len(variants))
	for i, v := range variants {
		mods[i] = module(b, v.path)
	}
	recs := counterRecords(50_000, 10_000)
	for b.Loop() {
		native := []float64{}
		times := make([][]float64, len(variants))
		for round := range 7 {
			runs := []func(){func() { native = append(native, runNative(recs)) }}
			for i, v := range variants {
				runs = append(runs, func() { times[i] = append(times[i], runWasm(b, mods[i], recs, v.prefix)) })
			}
			if round%2 == 1 {
				slices.Reverse(runs)
			}
			for _, run := range runs {
				run()
			}
		}
		b.ReportMetric(median(native), "native-ns/rec")
		for i, v := range variants {
			b.ReportMetric(median(times[i]), v.name+"-ns/rec")
			ratios := make([]float64, len(native))
			for r := range native {
				ratios[r] = native[r] / times[i][r]
			}
			b.ReportMetric(median(ratios), v.name+"/native")
		}
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
