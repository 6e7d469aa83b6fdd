package state

import (
	"context"
	"encoding/binary"
	"errors"
)

// Memory is a Backend that keeps all state in process memory, with no durable tier: every key is
// hot, Fetch is never needed, and a capture persists nowhere. It is what `clink-wasm run` uses
// when no state URL is given for a throwaway run, and the reference model in tests.
type Memory struct {
	names   []string
	m       map[string]*memEntry // one lookup per operation: values change in place
	opState map[string][]byte
	scratch []byte
}

type memEntry struct{ v []byte }

// NewMemory returns an empty in-memory backend.
func NewMemory() *Memory {
	return &Memory{m: make(map[string]*memEntry), opState: make(map[string][]byte)}
}

var _ Backend = (*Memory)(nil)

// Open implements Backend.
func (b *Memory) Open(names []string) error {
	if len(names) > 1<<16 {
		return errors.New("state: too many states")
	}
	b.names = append([]string(nil), names...)
	return nil
}

// AppendKey encodes k as (state id, record key length, record key, entry) into dst: a unique,
// prefix-free byte string per key.
func AppendKey(dst []byte, k Key) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(k.State))
	dst = binary.AppendUvarint(dst, uint64(len(k.Record)))
	dst = append(dst, k.Record...)
	return append(dst, k.Entry...)
}

// Get implements Backend.
func (b *Memory) Get(k Key) ([]byte, bool, bool) {
	b.scratch = AppendKey(b.scratch[:0], k)
	if e := b.m[string(b.scratch)]; e != nil {
		return e.v, true, true
	}
	return nil, false, true
}

// Put implements Backend.
func (b *Memory) Put(k Key, value []byte) {
	b.scratch = AppendKey(b.scratch[:0], k)
	if e := b.m[string(b.scratch)]; e != nil {
		e.v = append(e.v[:0], value...)
		return
	}
	b.m[string(b.scratch)] = &memEntry{v: append(make([]byte, 0, len(value)), value...)}
}

// Delete implements Backend.
func (b *Memory) Delete(k Key) {
	b.scratch = AppendKey(b.scratch[:0], k)
	delete(b.m, string(b.scratch))
}

// Fetch implements Backend. Every key is hot, so a fetch answers from memory.
func (b *Memory) Fetch(keys []Key, done func([]Fetched, error)) {
	out := make([]Fetched, len(keys))
	for i, k := range keys {
		v, ok, _ := b.Get(k)
		out[i] = Fetched{
			Key:   Key{State: k.State, Record: append([]byte(nil), k.Record...), Entry: append([]byte(nil), k.Entry...)},
			Value: append([]byte(nil), v...),
			Found: ok,
		}
	}
	done(out, nil)
}

// Fill implements Backend; it is a no-op because nothing is ever cold.
func (b *Memory) Fill([]Fetched) {}

// SetOperatorState implements Backend.
func (b *Memory) SetOperatorState(name string, data []byte) {
	b.opState[name] = append([]byte(nil), data...)
}

// OperatorState implements Backend.
func (b *Memory) OperatorState(name string) []byte { return b.opState[name] }

// Len returns the number of live entries.
func (b *Memory) Len() int { return len(b.m) }

// Capture implements Backend. The in-memory backend has nowhere durable to write, so the
// snapshot is empty.
func (b *Memory) Capture(uint64) (Snapshot, error) { return memSnapshot{}, nil }

// Close implements Backend.
func (b *Memory) Close() error { return nil }

type memSnapshot struct{}

func (memSnapshot) Persist(context.Context) error { return nil }
func (memSnapshot) Bytes() int64                  { return 0 }
