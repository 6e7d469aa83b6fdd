package state_test

import (
	"context"
	"fmt"

	"github.com/clink-wasm/clink-wasm/host/state"
)

// A subtask's life: open the store, get the backend, write, checkpoint, restore elsewhere and
// read back through a cold read.
func Example() {
	ctx := context.Background()
	store, err := state.Open(ctx, "mem://example", state.WithHotBytes(64<<20))
	if err != nil {
		panic(err)
	}
	defer store.Close()

	b, _ := store.Operator(ctx, state.OperatorOptions{Name: "counts", KeyGroups: state.KeyGroupRangeFor(0, 1, 128)})
	b.Open([]string{"count"})
	k := state.Key{State: 0, Record: []byte("user-1")}
	b.Put(k, []byte("42"))
	snap, _ := b.Capture(1)
	if err := snap.Persist(ctx); err != nil { // on a worker; acknowledge checkpoint 1 after this
		panic(err)
	}
	b.Close()

	r, _ := store.Operator(ctx, state.OperatorOptions{Name: "counts", RestoreFrom: 1})
	r.Open([]string{"count"})
	if _, _, hot := r.Get(k); !hot { // restored lazily: the value is cold
		done := make(chan []state.Fetched)
		r.Fetch([]state.Key{k}, func(f []state.Fetched, err error) { done <- f })
		f := <-done
		r.Fill(f)
	}
	v, found, _ := r.Get(k)
	fmt.Println(string(v), found)
	// Output: 42 true
}
