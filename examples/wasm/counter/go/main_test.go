//go:build !wasip1

package main

import (
	"flag"
	"strconv"
	"testing"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/clinktest"
)

var update = flag.Bool("update", false, "rewrite ../expected.jsonl from the output")

// TestExpected runs the operator natively over ../input.jsonl and compares with
// ../expected.jsonl. The same files check the built .wasm modules through the host.
func TestExpected(t *testing.T) {
	clinktest.CheckGolden(t, "..", "user", *update)
}

// BenchmarkProcess runs records of 1000 keys through the operator natively, one call per
// record; BenchmarkProcessBatch runs them in batches of 16 records of distinct keys, through
// the batch export the host's scheduler uses whenever several keys have records waiting.
// Their CPU profile together is default.pgo, the profile `go build` optimises the Wasm module
// with (profile-guided inlining of the hot calls: the Go guest's calls are what its time goes
// to), with the package's functions renamed to main.* as the module's build names them
// (clink-pgo; see the SDK's README, "Profile-guided optimisation"). Regenerate it after
// changing the operator or the SDK:
//
//	go test -run '^$' -bench Process -benchtime 20s -cpuprofile cpu.pprof .
//	go run github.com/clink-wasm/clink-wasm/guest-sdk/go/cmd/clink-pgo -o default.pgo cpu.pprof
func BenchmarkProcess(b *testing.B) {
	h, keys, v := benchSetup(b)
	i := 0
	for b.Loop() {
		if _, err := h.Process(keys[i%len(keys)], v, int64(i)); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkProcessBatch(b *testing.B) {
	h, keys, v := benchSetup(b)
	batch := make([]clink.Record, 16)
	i := 0
	for b.Loop() {
		for j := range batch {
			batch[j] = clink.Record{Key: keys[(i+j)%len(keys)], Value: v, Timestamp: int64(i + j)}
		}
		if _, err := h.ProcessBatch(batch); err != nil {
			b.Fatal(err)
		}
		i += len(batch)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(i), "ns/record")
}

func benchSetup(b *testing.B) (*clinktest.Harness, [][]byte, []byte) {
	h, err := clinktest.New()
	if err != nil {
		b.Fatal(err)
	}
	keys := make([][]byte, 1000)
	for i := range keys {
		keys[i] = []byte("user-" + strconv.Itoa(i))
	}
	return h, keys, []byte(`{"user":"user-1","page":"/checkout"}`)
}
