package abi_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// stateHandler serves one instance from a state.Memory backend, as the scheduler's plain
// benchmark loop does, and counts what is emitted.
type stateHandler struct {
	be    *state.Memory
	key   []byte
	emits int
	bytes int
}

func (h *stateHandler) Get(s uint32, e []byte) ([]byte, bool, error) {
	v, ok, _ := h.be.Get(state.Key{State: state.StateID(s), Record: h.key, Entry: e})
	return v, ok, nil
}
func (h *stateHandler) Put(s uint32, e, v []byte) error {
	h.be.Put(state.Key{State: state.StateID(s), Record: h.key, Entry: e}, v)
	return nil
}
func (h *stateHandler) Delete(s uint32, e []byte) error {
	h.be.Delete(state.Key{State: state.StateID(s), Record: h.key, Entry: e})
	return nil
}
func (h *stateHandler) Emit(k, v []byte) error    { h.emits++; h.bytes += len(k) + len(v); return nil }
func (h *stateHandler) RegisterTimer(int64) error { return nil }
func (h *stateHandler) DeleteTimer(int64) error   { return nil }
func (h *stateHandler) Watermark() int64          { return math.MinInt64 }
func (h *stateHandler) Log(abi.LogLevel, []byte)  {}
func (h *stateHandler) SetResumeOrder(int64)      {}
func (h *stateHandler) Lookup(uint32, []byte) (int, []byte, error) {
	return 0, nil, abi.LookupUnavailable
}

type benchRecord struct{ key, value []byte }

func counterRecords(n, keys int) []benchRecord {
	rng := rand.New(rand.NewPCG(1, 2))
	rs := make([]benchRecord, n)
	for i := range rs {
		k := "user-" + strconv.Itoa(rng.IntN(keys))
		rs[i] = benchRecord{[]byte(k), fmt.Appendf(nil, `{"user":%q,"seq":%d,"page":"/checkout"}`, k, i)}
	}
	return rs
}

// BenchmarkProcess is the per-record cost of Instance.Process for the counter example's guests
// (examples/wasm/counter) and for a guest whose clink_process does nothing (the floor of an
// export call), with the state backend the scheduler uses. ns/op is per record.
func BenchmarkProcess(b *testing.B) {
	benchGuests(b, []benchGuest{
		{"noop", "testdata/noop.wasm", false},
		{"as-counter", "../../examples/wasm/counter/counter-as.wasm", true},
		{"go-counter", "../../examples/wasm/counter/counter-go.wasm", true},
	})
}

// BenchmarkGoGuest splits what the Go counter costs per record, with probe guests built from
// testdata/goprobe: a bare //go:wasmexport clink_process that returns at once (what the Go
// runtime costs per export call), the SDK with an empty process function (its dispatch: guard,
// frames), the SDK reading and writing the prefetched count, and that plus the counter's JSON
// (everything but the emit). It builds the probes first, which takes a while.
func BenchmarkGoGuest(b *testing.B) {
	dir := b.TempDir()
	var guests []benchGuest
	for _, p := range []string{"bare", "sdknoop", "sdkstate", "sdkjson"} {
		out := filepath.Join(dir, p+".wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-buildvcs=false", "-ldflags=-s -w",
			"-o", out, "./host/abi/testdata/goprobe/"+p)
		cmd.Dir = filepath.Join("..", "..")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if msg, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("building probe %s: %v\n%s", p, err, msg)
		}
		guests = append(guests, benchGuest{"go-" + p, out, false})
	}
	guests = append(guests,
		benchGuest{"wat-noop", "testdata/noop.wasm", false},
		benchGuest{"go-counter", "../../examples/wasm/counter/counter-go.wasm", true})
	benchGuests(b, guests)
}

type benchGuest struct {
	name, path string
	emits      bool // one emit per record, checked
}

func benchGuests(b *testing.B, guests []benchGuest) {
	ctx := context.Background()
	e, err := abi.NewEngine(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close(ctx)
	recs := counterRecords(1<<14, 10_000)
	for _, g := range guests {
		b.Run(g.name, func(b *testing.B) {
			bin, err := os.ReadFile(g.path)
			if err != nil {
				b.Fatal(err)
			}
			m, err := e.Load(ctx, bin)
			if err != nil {
				b.Fatal(err)
			}
			h := &stateHandler{be: state.NewMemory()}
			in, err := m.Instantiate(ctx, h)
			if err != nil {
				b.Fatal(err)
			}
			defer in.Close(ctx)
			i := 0
			for b.Loop() {
				r := &recs[i&(len(recs)-1)]
				h.key = r.key
				if err := in.Process(r.key, r.value, int64(i)); err != nil {
					b.Fatal(err)
				}
				i++
			}
			if g.emits && h.emits != i {
				b.Fatalf("%d emits for %d records", h.emits, i)
			}
		})
	}
}
