package scheduler

import (
	"fmt"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// Source identifies what a task was processing, for error reports and output attribution.
type Source struct {
	Pos   int64  // source position of the record (e.g. its input line)
	Key   []byte // record key (aliases controller memory: copy to keep)
	TS    int64  // record or timer timestamp
	Timer bool   // a fired timer rather than a record
}

// OutputKind distinguishes data from watermarks in the output stream.
type OutputKind uint8

const (
	OutputData OutputKind = iota
	OutputWatermark
	OutputBarrier
)

// Output is one element leaving the operator.
type Output struct {
	Kind  OutputKind
	Key   []byte // aliases the batch arena
	Value []byte // aliases the batch arena
	TS    int64  // timestamp (data), watermark (OutputWatermark) or checkpoint ID (OutputBarrier)
	Src   Source
}

// Batch is a group of outputs handed to the Sink. Its slices alias an arena that the controller
// reuses once the sink returns the batch with Release.
type Batch struct {
	Outputs []Output
	arena   []byte
	free    chan *Batch
}

// Release returns the batch for reuse. The sink must not touch it afterwards.
func (b *Batch) Release() {
	b.Outputs = b.Outputs[:0]
	b.arena = b.arena[:0]
	select {
	case b.free <- b:
	default:
	}
}

// Sink receives the operator's output in order. Write is called on the runner; it may block,
// which is how backpressure from a slow consumer reaches the source. It must call Release on
// every batch once it is done with it (possibly later, from another goroutine).
type Sink interface {
	Write(b *Batch) error
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(*Batch) error

func (f SinkFunc) Write(b *Batch) error { return f(b) }

const (
	batchOutputs = 256
	batchBytes   = 64 << 10
)

// outBuffer accumulates outputs on the runner and hands full batches to the sink.
type outBuffer struct {
	sink Sink
	cur  *Batch
	free chan *Batch
	err  error
	in   *abi.Instance // set while add flushes for a guest call's emit: the flush runs as in.Blocking
	// flushed, if set, runs after every batch the sink took (release.go).
	flushed func()
}

func newOutBuffer(s Sink) *outBuffer {
	o := &outBuffer{sink: s, free: make(chan *Batch, 8)}
	o.cur = o.newBatch()
	return o
}

func (o *outBuffer) newBatch() *Batch {
	select {
	case b := <-o.free:
		return b
	default:
		return &Batch{Outputs: make([]Output, 0, batchOutputs), arena: make([]byte, 0, batchBytes), free: o.free}
	}
}

// emit appends an output. Key and value are copied into the batch arena.
func (o *outBuffer) emit(key, value []byte, ts int64, src Source) error {
	out, err := o.add(key, value, nil)
	if err != nil {
		return err
	}
	// Field by field, here and in add: a struct assignment copies with 16-byte loads, which
	// cannot forward from the 8-byte stores that just wrote src (or a literal): a stall of
	// several ns per output, measured on the all-hits path.
	out.TS = ts
	out.Src.Pos, out.Src.Key, out.Src.TS, out.Src.Timer = src.Pos, src.Key, src.TS, src.Timer
	return nil
}

// add appends a data output of key and value, copied into the batch arena, and returns it for
// the caller to set its timestamp and source (every other field is set). in is the instance
// whose guest call emits, if any: a flush the output needs then runs as in.Blocking.
func (o *outBuffer) add(key, value []byte, in *abi.Instance) (*Output, error) {
	if o.err != nil {
		return nil, o.err
	}
	b := o.cur
	if len(b.Outputs) == cap(b.Outputs) || (len(b.arena)+len(key)+len(value) > cap(b.arena) && len(b.Outputs) > 0) {
		o.in = in
		err := o.flush()
		o.in = nil
		if err != nil {
			return nil, err
		}
		b = o.cur
	}
	start := len(b.arena)
	b.arena = append(b.arena, key...)
	b.arena = append(b.arena, value...)
	kEnd := start + len(key)
	n := len(b.Outputs)
	b.Outputs = b.Outputs[:n+1]
	out := &b.Outputs[n]
	out.Kind = OutputData
	out.Key = b.arena[start:kEnd:kEnd]
	out.Value = b.arena[kEnd:len(b.arena):len(b.arena)]
	return out, nil
}

// mark appends a watermark or barrier to the output stream.
func (o *outBuffer) mark(kind OutputKind, v int64) error {
	if o.err != nil {
		return o.err
	}
	if len(o.cur.Outputs) == cap(o.cur.Outputs) {
		if err := o.flush(); err != nil {
			return err
		}
	}
	o.cur.Outputs = append(o.cur.Outputs, Output{Kind: kind, TS: v})
	return nil
}

// flush hands the current batch, if not empty, to the sink.
func (o *outBuffer) flush() error {
	if o.err != nil {
		return o.err
	}
	if len(o.cur.Outputs) == 0 {
		return nil
	}
	b := o.cur
	o.cur = o.newBatch()
	var err error
	if o.in != nil {
		err = o.in.Blocking(func() error { return o.sink.Write(b) })
	} else {
		err = o.sink.Write(b)
	}
	if err != nil {
		o.err = fmt.Errorf("sink: %w", err)
		return o.err
	}
	if o.flushed != nil {
		o.flushed()
	}
	return nil
}
