package scheduler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// waitSink waits, on its first Write, until a record it hands to another controller has come
// out of that controller's sink: the downstream operator of the same tenant that a full
// output batch waits for.
type waitSink struct {
	once sync.Once
	next chan<- []Element
	seen <-chan struct{}
	err  error
}

func (s *waitSink) Write(b *Batch) error {
	s.once.Do(func() {
		s.next <- []Element{rec("down", 0, 1, 1)}
		select {
		case <-s.seen:
		case <-time.After(time.Minute): // a bound on the wait, not a measurement
			s.err = errors.New("the downstream operator never ran while this call's emit waited for it")
		}
	})
	b.Release()
	return s.err
}

// signalSink closes seen at its first output.
type signalSink struct {
	once sync.Once
	seen chan struct{}
}

func (s *signalSink) Write(b *Batch) error {
	if len(b.Outputs) > 0 {
		s.once.Do(func() { close(s.seen) })
	}
	b.Release()
	return nil
}

// TestCPUShareEmitWaitsOnTenant: two operators of one tenant share a CPU share of one core,
// so one running slot. The first operator's call emits more than an output batch holds, and
// the flush inside that call waits for the second operator to run a record. The emitting call
// gives its slot up while the flush blocks (abi.Instance.Blocking), so both finish; holding
// it would deadlock the tenant.
func TestCPUShareEmitWaitsOnTenant(t *testing.T) {
	sh := abi.NewCPUShare(1)
	e, err := abi.NewEngine(t.Context(), abi.WithCPUShare(sh))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	bin, err := os.ReadFile("testdata/accum.wasm")
	if err != nil {
		t.Fatal(err)
	}
	m, err := e.Load(t.Context(), bin)
	if err != nil {
		t.Fatal(err)
	}
	downIn := make(chan []Element, 1)
	down := &signalSink{seen: make(chan struct{})}
	c2, err := New(m, state.NewMemory(), down)
	if err != nil {
		t.Fatal(err)
	}
	up := &waitSink{next: downIn, seen: down.seen}
	c1, err := New(m, state.NewMemory(), up)
	if err != nil {
		t.Fatal(err)
	}
	done2 := make(chan error, 1)
	go func() { done2 <- c2.Run(t.Context(), downIn) }()

	// One input batch of more records than an output batch holds: the flush comes inside a call.
	var els []Element
	for i := range 2 * batchOutputs {
		els = append(els, rec(fmt.Sprintf("k%d", i%7), uint64(i/7), int64(i+1), int64(i+1)))
	}
	in := make(chan []Element, 1)
	in <- els
	close(in)
	if err := c1.Run(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	close(downIn)
	if err := <-done2; err != nil {
		t.Fatal(err)
	}
	if p := sh.PeakRunning(); p != 1 {
		t.Fatalf("peak running guests %d with a share of one core", p)
	}
}
