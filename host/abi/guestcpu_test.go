//go:build linux

package abi_test

import (
	"context"
	"hash/maphash"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/state"
)

func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// BenchmarkGuestCPU compares the per-record CPU time of Instance.Process for the modules
// CLINK_GUESTS names (comma-separated paths), in alternating rounds on one locked thread:
// CLINK_ROUNDS of them (9 by default), each module's instance created afresh per round. It
// reports each module's median round and, for a loaded machine, its lowest and first-quartile
// rounds (interference only ever adds time).
func BenchmarkGuestCPU(b *testing.B) {
	paths := strings.Split(os.Getenv("CLINK_GUESTS"), ",")
	if paths[0] == "" {
		b.Skip("CLINK_GUESTS not set")
	}
	ctx := context.Background()
	e, err := abi.NewEngine(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close(ctx)
	recs := counterRecords(1<<15, 10_000)
	mods := make([]*abi.Module, len(paths))
	batches := make([]int, len(paths))
	for i, p := range paths {
		// path@N: through ProcessBatch, in batches of up to N records.
		if at := strings.LastIndexByte(p, '@'); at > 0 {
			batches[i], _ = strconv.Atoi(p[at+1:])
			p = p[:at]
		}
		bin, err := os.ReadFile(p)
		if err != nil {
			b.Fatal(err)
		}
		if mods[i], err = e.Load(ctx, bin); err != nil {
			b.Fatal(err)
		}
	}
	batch := 0
	if v := os.Getenv("CLINK_BATCH"); v != "" {
		batch, _ = strconv.Atoi(v)
	}
	rounds := 9
	if v, err := strconv.Atoi(os.Getenv("CLINK_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	for b.Loop() {
		res := make([][]float64, len(paths))
		runtime.LockOSThread()
		for r := range rounds {
			for j := range mods {
				i := j
				if r%2 == 1 {
					i = len(mods) - 1 - j
				}
				h := &batchStateHandler{stateHandler: stateHandler{be: state.NewMemory()}}
				in, err := mods[i].Instantiate(ctx, h)
				if err != nil {
					b.Fatal(err)
				}
				c0 := threadCPU()
				if n := max(batch, batches[i]); n > 1 && mods[i].HasBatch() {
					runBatched(b, in, h, recs, n)
					res[i] = append(res[i], float64(threadCPU()-c0)/float64(len(recs)))
					in.Close(ctx)
					continue
				}
				for k := range recs {
					h.key = recs[k].key
					if err := in.Process(recs[k].key, recs[k].value, int64(k)); err != nil {
						b.Fatal(err)
					}
				}
				res[i] = append(res[i], float64(threadCPU()-c0)/float64(len(recs)))
				in.Close(ctx)
			}
		}
		runtime.UnlockOSThread()
		for i := range paths {
			slices.Sort(res[i])
			name := paths[i][strings.LastIndex(paths[i], "/")+1:]
			name = strings.Replace(strings.Replace(name, ".wasm", "", 1), "@", "-b", 1)
			b.ReportMetric(res[i][len(res[i])/2], name+"-cpu-ns/rec")
			b.ReportMetric(res[i][0], name+"-min-ns/rec")
			b.ReportMetric(res[i][len(res[i])/4], name+"-p25-ns/rec")
		}
	}
}

// batchStateHandler is a stateHandler that serves batch calls.
type batchStateHandler struct {
	stateHandler
	recs []abi.BatchRecord
}

func (h *batchStateHandler) SelectRecord(i int) { h.key = h.recs[i].Key }

// runBatched processes recs in batches of up to n records of distinct keys, cut where a key
// repeats, as the scheduler does.
func runBatched(tb testing.TB, in *abi.Instance, h *batchStateHandler, recs []benchRecord, n int) {
	batch := make([]abi.BatchRecord, 0, n)
	flush := func() {
		h.recs = batch
		done, err := in.ProcessBatch(batch)
		if err != nil || done != len(batch) {
			tb.Fatalf("batch: %d of %d done: %v", done, len(batch), err)
		}
		batch = batch[:0]
	}
	// The scheduler's check (host/scheduler/batch.go): a 256-bit filter of key hashes, and a
	// comparison with the batch's keys only when it says "maybe".
	var filter [4]uint64
	seed := maphash.MakeSeed()
	for k := range recs {
		h := maphash.Bytes(seed, recs[k].key)
		dup := len(batch) == n
		if !dup && filter[(h>>6)&3]&(1<<(h&63)) != 0 {
			for i := range batch {
				if string(batch[i].Key) == string(recs[k].key) {
					dup = true
					break
				}
			}
		}
		if dup {
			flush()
			filter = [4]uint64{}
		}
		filter[(h>>6)&3] |= 1 << (h & 63)
		batch = append(batch, abi.BatchRecord{Key: recs[k].key, Value: recs[k].value, TS: int64(k)})
	}
	if len(batch) > 0 {
		flush()
	}
}
