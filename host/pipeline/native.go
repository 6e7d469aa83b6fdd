package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// Native operators.
//
// A NativeOperator is Go code run in place of an operator's module (Env.Native): the same
// subtask, input merger, routing, state backend and checkpoints, without the Wasm instance
// and the async execution controller. It exists to measure what those cost: issue 12's
// native comparison runs one pipeline with the AssemblyScript counter and the same pipeline
// with a native counter. It runs records one at a time, synchronously (a cold state read
// blocks the subtask), and has no timers and no lookups. The operator's module is still
// loaded: its manifest names the states, and the checkpoint record names the module.

// NativeOperator processes one record of key with c's state and outputs.
type NativeOperator func(c *NativeCall, key, value []byte, ts int64) error

// NativeCall is a native operator's access to its record's keyed state and to its outputs.
type NativeCall struct {
	t   *operatorTask
	key []byte
	ts  int64
	pos int64
	fs  []state.Key
}

// Get reads entry of state (an index into the module's manifest states) for the record's key.
func (c *NativeCall) Get(st uint32, entry []byte) ([]byte, bool, error) {
	k := state.Key{State: state.StateID(st), Record: c.key, Entry: entry}
	v, found, hot := c.t.backend.Get(k)
	if hot {
		return v, found, nil
	}
	type res struct {
		f   []state.Fetched
		err error
	}
	ch := make(chan res, 1)
	c.fs = append(c.fs[:0], k)
	c.t.backend.Fetch(c.fs, func(f []state.Fetched, err error) { ch <- res{f, err} })
	r := <-ch
	if r.err != nil {
		return nil, false, r.err
	}
	c.t.backend.Fill(r.f)
	return r.f[0].Value, r.f[0].Found, nil
}

// Put writes entry of state for the record's key.
func (c *NativeCall) Put(st uint32, entry, value []byte) {
	c.t.backend.Put(state.Key{State: state.StateID(st), Record: c.key, Entry: entry}, value)
}

// Emit sends an output record with the input record's timestamp.
func (c *NativeCall) Emit(key, value []byte) error {
	return c.t.out.route(c.t.out.main, key, value, c.ts, c.pos)
}

// runNative is run() for a native operator.
func (t *operatorTask) runNative(ctx context.Context, op NativeOperator) error {
	t.persistQ = make(chan persistJob, 4)
	t.persistE = make(chan error, 1)
	go t.persister(ctx)
	in, cancelIn, waitIn := t.in.start(ctx)
	defer cancelIn()
	runErr := t.nativeLoop(ctx, op, in)
	if runErr != nil {
		cancelIn()
	}
	mErr := waitIn()
	close(t.persistQ)
	pErr := <-t.persistE
	if err := errors.Join(runErr, mErr, pErr); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	return t.out.close()
}

func (t *operatorTask) nativeLoop(ctx context.Context, op NativeOperator, in <-chan []scheduler.Element) error {
	c := &NativeCall{t: t}
	for {
		var b []scheduler.Element
		select {
		case bb, ok := <-in:
			if !ok {
				return nil
			}
			b = bb
		case <-ctx.Done(): // a channel passed through need not be closed after a failure
			return nil
		}
		for i := range b {
			el := &b[i]
			var err error
			switch el.Kind {
			case scheduler.ElementRecord:
				c.key, c.ts, c.pos = el.Key, el.TS, el.Pos
				if err = op(c, el.Key, el.Value, el.TS); err != nil {
					err = fmt.Errorf("operator %s (native) failed at %s: %w", t.name(), t.describe(el.Pos), err)
				}
			case scheduler.ElementWatermark:
				err = t.out.mark(*el)
			case scheduler.ElementBarrier:
				if err = t.onBarrier(el.CheckID); err == nil {
					err = t.out.mark(*el)
				}
			}
			if err != nil {
				return err
			}
		}
		// Done with b: the operator's outputs and state writes were copies.
		t.in.batches.release(b)
		if err := t.out.flush(); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}
