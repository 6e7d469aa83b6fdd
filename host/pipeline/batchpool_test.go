package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/scheduler"
)

// pooledBatch builds a pooled batch of p from els, copying their keys and values into its
// arena as an edgeOut would.
func pooledBatch(p *batchPool, els ...scheduler.Element) []scheduler.Element {
	b := p.get()
	for _, el := range els {
		if el.Kind == scheduler.ElementRecord {
			b.room(len(el.Key) + len(el.Value))
			kv := b.add(el.Key, el.Value)
			el.Key, el.Value = kv[:len(el.Key):len(el.Key)], kv[len(el.Key):]
		}
		b.els = append(b.els, el)
	}
	return b.els
}

func keyed(k string, ts int64) scheduler.Element {
	return scheduler.Element{Kind: scheduler.ElementRecord, Key: []byte(k), Value: []byte(`{"k":"` + k + `"}`), TS: ts, Pos: ts}
}

// TestBatchPoolReuse: a released batch comes back from get, empty and poisoned in between;
// a slice that does not start a pooled batch is ignored; the pool keeps at most maxFree.
func TestBatchPoolReuse(t *testing.T) {
	p := newBatchPool(2)
	p.poison, p.distance = true, 0
	b1 := pooledBatch(p, keyed("a", 1), keyed("b", 2))
	kept := b1[0].Key // what a consumer that kept a reference would read
	p.release(b1[1:]) // not the batch's start: ignored
	if kept[0] != 'a' {
		t.Fatal("a slice that is not a batch's start released the batch")
	}
	p.release(b1)
	if kept[0] != poisonByte || b1[1].Pos != -1 {
		t.Fatalf("a released batch is not poisoned: key %q, element %+v", kept, b1[1])
	}
	p.release(b1) // twice: ignored, or the batch would be handed to two producers
	if n := len(p.free); n != 1 {
		t.Fatalf("free list after a double release: %d batches", n)
	}
	p.free = p.free[:0]
	b1b := p.known[&b1[:1][0]]
	b1b.idle = false
	p.release(b1)
	if b := p.get(); &b.els[:1][0] != &b1[:1][0] || len(b.els) != 0 || len(b.arena) != 0 {
		t.Fatal("get did not hand back the released batch, empty")
	}
	// maxFree: the third idle batch is dropped (and forgotten).
	var bs [][]scheduler.Element
	for range 3 {
		bs = append(bs, pooledBatch(p, keyed("x", 1)))
	}
	for _, b := range bs {
		p.release(b)
	}
	if len(p.free) != 2 || p.known[&bs[2][:1][0]] != nil {
		t.Fatalf("free %d, third known %v", len(p.free), p.known[&bs[2][:1][0]] != nil)
	}
	p.release([]scheduler.Element{keyed("y", 1)}) // not pooled at all: ignored
}

// TestBatchRoom: a batch's arena grows for its records up to maxBatchArena, then the batch
// must be sent; a record larger than that alone gets an arena of its size; records already
// in the batch keep their bytes when the arena is replaced.
func TestBatchRoom(t *testing.T) {
	p := newBatchPool(4)
	b := p.get()
	big := bytes.Repeat([]byte("v"), 300<<10)
	var kvs [][]byte
	for i := 0; ; i++ {
		if !b.room(len(big)) {
			if i < 3 || cap(b.arena) < maxBatchArena {
				t.Fatalf("batch full after %d records, arena %d", i, cap(b.arena))
			}
			break
		}
		kvs = append(kvs, b.add([]byte(fmt.Sprint(i)), big))
		b.els = append(b.els, scheduler.Element{Kind: scheduler.ElementRecord})
	}
	for i, kv := range kvs {
		if !bytes.Equal(kv, append([]byte(fmt.Sprint(i)), big...)) {
			t.Fatalf("record %d changed when the arena grew", i)
		}
	}
	e := p.get()
	huge := bytes.Repeat([]byte("h"), 2*maxBatchArena)
	if !e.room(len(huge)) || cap(e.arena) < len(huge) {
		t.Fatal("an empty batch has no room for a record larger than maxBatchArena")
	}
	e.add(nil, huge)
	e.els = append(e.els, scheduler.Element{Kind: scheduler.ElementRecord})
	p.release(e.els)
	if cap(p.get().arena) > maxBatchArena {
		t.Fatal("the pool kept an arena larger than maxBatchArena")
	}
}

// TestMergerPooledRest: with pooled inputs, the records after a barrier wait for its
// alignment in a copy: the consumer may release (and the pool poison and reuse) the batch as
// soon as it has what came before the barrier, and the held records still arrive intact.
func TestMergerPooledRest(t *testing.T) {
	a, b := newChannel("a", "x"), newChannel("b", "x")
	m := newMerger([]*channel{a, b})
	p := newBatchPool(16)
	p.poison = true
	m.pool(p)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.run(ctx) }()

	a.deliver(pooledBatch(p, keyed("r1", 1), keyed("r2", 2), bar(1), keyed("r3", 3), keyed("r4", 4)))
	got := <-m.out
	if len(got) != 2 || string(got[0].Key) != "r1" || string(got[1].Key) != "r2" {
		t.Fatalf("before the barrier: %+v", got)
	}
	p.release(got) // the consumer is done with it: poisoned now
	// Reuse the released batch at once, as a producer would.
	a.deliver(pooledBatch(p, keyed("q1", 9)))
	b.deliver(pooledBatch(p, keyed("s1", 5), bar(1)))
	var keys []string
	deadline := time.After(5 * time.Second)
	for len(keys) < 5 {
		select {
		case out := <-m.out:
			for _, el := range out {
				switch el.Kind {
				case scheduler.ElementRecord:
					keys = append(keys, string(el.Key)+"="+string(el.Value))
				case scheduler.ElementBarrier:
					keys = append(keys, "|")
				}
			}
			p.release(out)
		case <-deadline:
			t.Fatalf("stuck after %v", keys)
		}
	}
	want := []string{`s1={"k":"s1"}`, "|", `r3={"k":"r3"}`, `r4={"k":"r4"}`, `q1={"k":"q1"}`}
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", keys, want)
	}
	a.closeSignal()
	b.closeSignal()
	for range m.out {
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestRouterPooledBatches: an edge into a pooled channel sends pooled batches, which come
// back to the pool on release and are sent again after distance others, so a steady stream
// allocates no batch.
func TestRouterPooledBatches(t *testing.T) {
	for _, distance := range []int{0, 3, reuseDistance} {
		c := newChannel("up", "down")
		p := newBatchPool(reuseDistance + 8)
		p.distance = distance
		c.pool = p
		e := newEdgeOut(false, nil, []*channel{c}, 1, 128)
		r := &router{name: "up[0]", ctx: context.Background(), log: slog.New(slog.DiscardHandler), stuckAfter: time.Minute, main: []*edgeOut{e}}
		seen := map[*scheduler.Element]bool{}
		sent := 0
		for i := range (2*reuseDistance + 20) * batchRecords {
			k := fmt.Sprint("k", i)
			if err := r.route(r.main, []byte(k), []byte(k), int64(i), int64(i)); err != nil {
				t.Fatal(err)
			}
			select {
			case b := <-c.ch:
				for j, el := range b {
					if want := fmt.Sprint("k", i-len(b)+1+j); string(el.Key) != want || string(el.Value) != want {
						t.Fatalf("record %q %q, want %q", el.Key, el.Value, want)
					}
				}
				seen[&b[:1][0]] = true
				sent++
				p.release(b)
			default:
			}
		}
		if len(seen) != distance+1 {
			t.Fatalf("distance %d: %d batches sent in %d distinct batches, want %d", distance, sent, len(seen), distance+1)
		}
	}
}
