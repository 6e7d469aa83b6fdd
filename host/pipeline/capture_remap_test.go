package pipeline

import (
	"context"
	"fmt"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// TestRemapCapturedInput: after a restore at another parallelism (2 -> 1 -> 3), each subtask
// replays exactly the captured records of its own key groups, each key's in their order, and
// starts from the lowest watermark of the old subtasks it takes over.
func TestRemapCapturedInput(t *testing.T) {
	ctx := context.Background()
	store, err := state.Open(ctx, "mem://")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	const numKG = 128
	// Old subtask i of 2 captured, per key of its own, three records in order.
	want := map[string][]int64{} // key -> positions, in order
	checkpoint := func(id uint64, par int, restore uint64, blobs func(i int, b *state.Tiered)) {
		for i := range par {
			b, err := store.Operator(ctx, state.OperatorOptions{Name: "op", NumKeyGroups: numKG,
				KeyGroups: state.KeyGroupRangeFor(i, par, numKG), RestoreFrom: restore})
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Open([]string{"s"}); err != nil {
				t.Fatal(err)
			}
			blobs(i, b)
			snap, err := b.Capture(id)
			if err != nil {
				t.Fatal(err)
			}
			if err := snap.Persist(ctx); err != nil {
				t.Fatal(err)
			}
			b.Close()
		}
	}
	checkpoint(1, 2, 0, func(i int, b *state.Tiered) {
		in := scheduler.CapturedInput{Watermark: int64(100 + i)}
		for k := range 40 {
			key := fmt.Sprintf("k%d", k)
			if !b.KeyGroups().Contains(state.KeyGroupOf([]byte(key), numKG)) {
				continue
			}
			for r := range 3 {
				pos := int64(k*10 + r)
				in.Records = append(in.Records, scheduler.Element{Kind: scheduler.ElementRecord, Key: []byte(key), Value: []byte("v"), TS: pos, Pos: pos})
				want[key] = append(want[key], pos)
			}
		}
		b.SetOperatorState(scheduler.InputStateName, scheduler.EncodeCapturedInput(in))
	})
	check := func(b *state.Tiered, wantWM int64) int {
		t.Helper()
		if err := remapCapturedInput(b); err != nil {
			t.Fatal(err)
		}
		in, err := scheduler.DecodeCapturedInput(b.OperatorState(scheduler.InputStateName))
		if err != nil {
			t.Fatal(err)
		}
		if in.Watermark != wantWM {
			t.Fatalf("range %v: watermark %d, want %d", b.KeyGroups(), in.Watermark, wantWM)
		}
		got := map[string][]int64{}
		for _, r := range in.Records {
			if !b.KeyGroups().Contains(state.KeyGroupOf(r.Key, numKG)) {
				t.Fatalf("range %v replays key %q of another subtask", b.KeyGroups(), r.Key)
			}
			got[string(r.Key)] = append(got[string(r.Key)], r.Pos)
		}
		for k, w := range want {
			if !b.KeyGroups().Contains(state.KeyGroupOf([]byte(k), numKG)) {
				continue
			}
			if fmt.Sprint(got[k]) != fmt.Sprint(w) {
				t.Fatalf("range %v key %s: replays %v, want %v", b.KeyGroups(), k, got[k], w)
			}
		}
		return len(in.Records)
	}
	// 2 -> 1: one subtask takes both blobs, and the lower watermark.
	n := 0
	checkpoint(2, 1, 1, func(_ int, b *state.Tiered) {
		n += check(b, 100)
	})
	if n != 3*40 {
		t.Fatalf("1 subtask replays %d records, want %d", n, 3*40)
	}
	// 1 -> 3 (from checkpoint 2, which kept the merged blob): each takes its share.
	n = 0
	checkpoint(3, 3, 2, func(_ int, b *state.Tiered) {
		n += check(b, 100)
	})
	if n != 3*40 {
		t.Fatalf("3 subtasks replay %d records, want %d", n, 3*40)
	}
	// The same parallelism: the blob is the subtask's own, untouched.
	checkpoint(4, 3, 3, func(_ int, b *state.Tiered) {
		before := string(b.OperatorState(scheduler.InputStateName))
		if err := remapCapturedInput(b); err != nil || string(b.OperatorState(scheduler.InputStateName)) != before {
			t.Fatalf("same parallelism: %v", err)
		}
	})
}
