package abi

import (
	"context"
	"testing"
)

// countingCtx counts the Value calls that reach it.
type countingCtx struct {
	context.Context
	calls int
}

func (c *countingCtx) Value(key any) any {
	c.calls++
	return c.Context.Value(key)
}

type ctxKeyA struct{}
type ctxKeyB struct{}

// TestInstanceCtxValue checks an instance context's answers: its Instance under instanceKey,
// and every other key's value from its parent, whichever order they are asked in, with a key
// asked for again in a row answered without walking the parent chain.
func TestInstanceCtxValue(t *testing.T) {
	parent := &countingCtx{Context: context.WithValue(context.WithValue(context.Background(), ctxKeyA{}, "a"), ctxKeyB{}, "b")}
	in := &Instance{}
	c := &instanceCtx{Context: parent, in: in}
	if got := c.Value(instanceKey{}); got != in {
		t.Fatalf("Value(instanceKey) = %v, want the instance", got)
	}
	for i, k := range []struct {
		key   any
		want  any
		calls int // the parent's Value calls after this one
	}{
		{ctxKeyA{}, "a", 1},
		{ctxKeyA{}, "a", 1}, // the same key again: no walk
		{ctxKeyB{}, "b", 2},
		{ctxKeyA{}, "a", 3},
		{struct{}{}, nil, 4}, // absent: nil, remembered too
		{struct{}{}, nil, 4},
		{ctxKeyB{}, "b", 5},
	} {
		if got := c.Value(k.key); got != k.want {
			t.Errorf("%d: Value(%T) = %v, want %v", i, k.key, got, k.want)
		}
		if parent.calls != k.calls {
			t.Errorf("%d: the parent was asked %d times, want %d", i, parent.calls, k.calls)
		}
	}
	if got := c.Value(instanceKey{}); got != in || parent.calls != 5 {
		t.Errorf("Value(instanceKey) = %v after %d parent calls", got, parent.calls)
	}
}
