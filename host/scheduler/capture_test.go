package scheduler

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clink-wasm/clink-wasm/host/state"
)

// checkCut checks the consistent cut at barrier id: for every key, the state's count plus the
// records of the key the barrier captured equals the records of the key before the barrier,
// and the captured ones are the key's last ones before it, in order. It adds the number of
// captured records to *captured.
func checkCut(tier *fakeTier, before map[string]uint64, id uint64, captured *int) error {
	in, err := DecodeCapturedInput(tier.opState[InputStateName])
	if err != nil {
		return fmt.Errorf("barrier %d: %w", id, err)
	}
	*captured += len(in.Records)
	next := map[string]uint64{} // per key: the index the next captured record must have
	for k := range before {
		v, ok := tier.view(state.Key{Record: []byte(k)})
		if ok {
			next[k] = binary.LittleEndian.Uint64(v)
		}
	}
	for _, r := range in.Records {
		k, i := string(r.Key), binary.LittleEndian.Uint64(r.Value)
		if i != next[k] {
			return fmt.Errorf("barrier %d: key %s: captured record %d, want %d (its count in state, or the previous captured one's successor)", id, k, i, next[k])
		}
		next[k] = i + 1
	}
	for k, want := range before {
		if next[k] != want {
			return fmt.Errorf("barrier %d: key %s: count %d plus captured records reach %d, want %d", id, k, next[k], next[k], want)
		}
	}
	for k := range next {
		if _, ok := before[k]; !ok && next[k] != 0 {
			return fmt.Errorf("barrier %d: key %s counted or captured before any record of it", id, k)
		}
	}
	return nil
}

// TestCaptureRestore is the crash test of barrier capture in the scheduler: a random workload
// runs with barriers capturing input; at a barrier that captured records the state and the
// operator state (timers, captured input) are copied, as a checkpoint would keep them. The
// run "crashes" there: a second controller starts over the copy and takes the input after
// that barrier. Its outputs, after the first run's outputs up to that barrier's mark, must be
// exactly once, in per-key order and read-your-writes (checkOutputs), with timers and
// watermarks in order.
func TestCaptureRestore(t *testing.T) {
	m := loadModule(t, "testdata/accumpf.wasm")
	mc := loadModule(t, "testdata/accum.wasm")
	seeds, records := soak()
	restored := 0
	for seed := uint64(1); seed <= seeds; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 11))
				w := genWorkload(rng, records, 1+rng.IntN(100))
				// Fewer watermarks: a barrier behind a closed epoch runs that epoch's records
				// first, and captures only the open epoch's.
				elems, nwm := w.elems[:0:0], 0
				for _, e := range w.elems {
					if e.Kind == ElementWatermark && e.TS != math.MaxInt64 {
						if nwm++; nwm%6 != 0 {
							continue
						}
					}
					elems = append(elems, e)
				}
				w.elems = elems
				mod := m
				if seed%2 == 1 {
					mod = mc // cold reads inside the call, not only prefetched
				}
				tier := newFakeTier(seed, 0, time.Duration(1+rng.IntN(3))*time.Millisecond, rng.Float64()*0.5)
				sink := &collectSink{}
				var (
					cutAt    uint64 // the barrier the crash is at
					remote   map[string][]byte
					opState  map[string][]byte
					cutErr   error
					captured int
					hits     int
					target   = 1 + int(seed%3)
				)
				onBarrier := func(id uint64) error {
					n := captured
					if err := checkCut(tier, w.barriers[id], id, &captured); err != nil && cutErr == nil {
						cutErr = err
					}
					if _, err := tier.Capture(id); err != nil {
						return err
					}
					if hits < target && captured > n { // the target-th barrier that captured, or the last
						hits++
						cutAt = id
						tier.mu.Lock()
						remote = maps.Clone(tier.remote)
						tier.mu.Unlock()
						opState = map[string][]byte{}
						for k, v := range tier.opState {
							opState[k] = bytes.Clone(v)
						}
					}
					return nil
				}
				maxInFlight := 1 + rng.IntN(32)
				opts := []Option{WithMaxInFlight(maxInFlight), WithExecMode(ExecMode(seed % 3)), WithBarrierCapture(CaptureAll)}
				c, err := New(mod, tier, sink, append(opts, WithOnBarrier(onBarrier))...)
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Run(context.Background(), feed(w.elems, 1+rng.IntN(50))); err != nil {
					t.Fatal(err)
				}
				tier.pending.Wait()
				if cutErr != nil {
					t.Fatal(cutErr)
				}
				checkOutputs(t, w, sink.outs)
				if cutAt == 0 {
					t.Skipf("no barrier captured a record (%d barriers)", c.Metrics().Barriers)
				}
				// The outputs up to the barrier's mark survive the crash; the rest are lost.
				var outs []out
				for _, o := range sink.outs {
					if o.kind == OutputBarrier && uint64(o.ts) == cutAt {
						break
					}
					outs = append(outs, o)
				}
				var rest []Element
				for i, e := range w.elems {
					if e.Kind == ElementBarrier && e.CheckID == cutAt {
						rest = w.elems[i+1:]
						break
					}
				}
				tier2 := newFakeTier(seed+1000, 0, time.Duration(1+rng.IntN(3))*time.Millisecond, rng.Float64()*0.5)
				tier2.remote, tier2.opState = remote, opState
				in, err := DecodeCapturedInput(opState[InputStateName])
				if err != nil || len(in.Records) == 0 {
					t.Fatalf("the checkpoint's captured input: %d records, %v", len(in.Records), err)
				}
				sink2 := &collectSink{}
				c2, err := New(mod, tier2, sink2, append(opts, WithOnBarrier(func(id uint64) error {
					_, err := tier2.Capture(id)
					return err
				}))...)
				if err != nil {
					t.Fatal(err)
				}
				if err := c2.Run(context.Background(), feed(rest, 1+rng.IntN(50))); err != nil {
					t.Fatal(err)
				}
				tier2.pending.Wait()
				checkOutputs(t, w, append(outs, sink2.outs...))
				restored++
				t.Logf("cap %d: crashed at barrier %d with %d records captured; %d replayed", maxInFlight, cutAt, len(in.Records), len(in.Records))
			})
		})
	}
	if restored == 0 {
		t.Fatal("no seed captured a record at a barrier: the restore was never tested")
	}
}

// TestCapturedInputCodec round-trips the blob and refuses damaged ones with ErrCapturedInput.
func TestCapturedInputCodec(t *testing.T) {
	in := CapturedInput{Watermark: -5, Records: []Element{
		{Kind: ElementRecord, Key: []byte("k1"), Value: []byte("v1"), TS: 7, Pos: 3},
		{Kind: ElementRecord, Key: []byte{}, Value: bytes.Repeat([]byte("x"), 300), TS: math.MinInt64, Pos: -1},
	}}
	b := EncodeCapturedInput(in)
	got, err := DecodeCapturedInput(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Watermark != in.Watermark || len(got.Records) != 2 {
		t.Fatalf("got %+v", got)
	}
	for i, r := range got.Records {
		w := in.Records[i]
		if !bytes.Equal(r.Key, w.Key) || !bytes.Equal(r.Value, w.Value) || r.TS != w.TS || r.Pos != w.Pos || r.Kind != ElementRecord {
			t.Fatalf("record %d: got %+v, want %+v", i, r, w)
		}
	}
	if e, err := DecodeCapturedInput(nil); err != nil || len(e.Records) != 0 || e.Watermark != math.MinInt64 {
		t.Fatalf("empty blob: %+v, %v", e, err)
	}
	for n := 1; n < len(b); n++ {
		if _, err := DecodeCapturedInput(b[:n]); !errors.Is(err, ErrCapturedInput) {
			t.Fatalf("truncated at %d: %v", n, err)
		}
	}
	if _, err := DecodeCapturedInput(append(bytes.Clone(b), 0)); !errors.Is(err, ErrCapturedInput) {
		t.Fatalf("trailing byte: %v", err)
	}
	bad := bytes.Clone(b)
	bad[0] = 2
	if _, err := DecodeCapturedInput(bad); !errors.Is(err, ErrCapturedInput) {
		t.Fatalf("version 2: %v", err)
	}
}

// FuzzCapturedInput: the decoder never panics, and what it accepts re-encodes to the same bytes.
func FuzzCapturedInput(f *testing.F) {
	f.Add(EncodeCapturedInput(CapturedInput{Watermark: 3, Records: []Element{{Key: []byte("a"), Value: []byte("b"), TS: 1, Pos: 2}}}))
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := DecodeCapturedInput(b)
		if err != nil || len(b) == 0 {
			return
		}
		if re := EncodeCapturedInput(in); !bytes.Equal(re, b) {
			// Varints have one canonical form in Go's encoder; a non-canonical input that
			// decodes is still fine as long as it decodes to the same thing again.
			in2, err := DecodeCapturedInput(re)
			if err != nil || in2.Watermark != in.Watermark || len(in2.Records) != len(in.Records) {
				t.Fatalf("re-encoding %x gave %x: %v", b, re, err)
			}
		}
	})
}

// TestCaptureBounded: what a barrier captures is bounded by admission, the in-flight cap plus
// the waiting records' memory (WithWaitingMemory), however much input is at hand. A few hot
// keys of slow cold reads park most records, so the bound is reached.
func TestCaptureBounded(t *testing.T) {
	m := loadModule(t, "testdata/accumpf.wasm")
	synctest.Test(t, func(t *testing.T) {
		const maxInFlight, waiting, n = 16, 64 << 10, 20000
		var elems []Element
		perKey := map[string]uint64{}
		for i := range n {
			k := fmt.Sprintf("k%d", i%7)
			if i%5 == 0 { // a cold key now and then: its fill evicts the hot ones (once clean)
				k = fmt.Sprintf("c%d", i)
			}
			elems = append(elems, rec(k, perKey[k], 1000, int64(i+1)))
			perKey[k]++
			if i%1000 == 999 { // after the first, each capture makes the keys clean, and evictable
				elems = append(elems, Element{Kind: ElementBarrier, CheckID: uint64(i/1000 + 1)})
			}
		}
		elems = append(elems, Element{Kind: ElementWatermark, TS: math.MaxInt64})
		tier := newFakeTier(1, 20*time.Millisecond, 20*time.Millisecond, 0.9)
		var blob []byte
		onBarrier := func(id uint64) error {
			b := tier.opState[InputStateName]
			if got, err := DecodeCapturedInput(b); err != nil {
				return err
			} else if prev, _ := DecodeCapturedInput(blob); len(got.Records) > len(prev.Records) {
				blob = bytes.Clone(b)
			}
			_, err := tier.Capture(id)
			return err
		}
		c, err := New(m, tier, &collectSink{}, WithMaxInFlight(maxInFlight), WithWaitingMemory(waiting),
			WithBarrierCapture(CaptureAll), WithOnBarrier(onBarrier))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Run(context.Background(), feed(elems, 256)); err != nil {
			t.Fatal(err)
		}
		tier.pending.Wait()
		in, err := DecodeCapturedInput(blob)
		if err != nil {
			t.Fatal(err)
		}
		each := waitSize(&task{key: elems[0].Key, value: elems[0].Value})
		most := maxInFlight + int(waiting/each) + 1
		if len(in.Records) == 0 || len(in.Records) > most {
			t.Fatalf("captured %d records, want 1..%d (cap %d, waiting memory %d at %d bytes a record)", len(in.Records), most, maxInFlight, waiting, each)
		}
		if s := c.Metrics(); s.MaxCaptured != int64(len(in.Records)) || s.CaptureFallbacks != 0 {
			t.Fatalf("metrics: %d captured at most, %d fallbacks; the blob has %d", s.MaxCaptured, s.CaptureFallbacks, len(in.Records))
		}
		t.Logf("captured %d records (%d bytes) of at most %d", len(in.Records), len(blob), most)
	})
}

func captureIf(on bool) func(uint64) bool {
	if on {
		return CaptureAll
	}
	return nil
}
