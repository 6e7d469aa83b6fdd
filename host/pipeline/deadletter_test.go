package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// memSource is a bounded in-memory source of raw values, one split, keyed by the source.
type memSource struct{ recs []SourceRecord }

func (s *memSource) Splits(context.Context) ([]string, error) { return []string{"mem"}, nil }
func (s *memSource) Bounded() bool                            { return true }
func (s *memSource) Open(_ context.Context, sp []Split) (SourceReader, error) {
	r := &memReader{s: s}
	if len(sp) == 1 && sp[0].Position != nil {
		n, _ := strconv.Atoi(string(sp[0].Position))
		r.next = n
	}
	return r, nil
}

type memReader struct {
	s    *memSource
	next int
}

func (r *memReader) Read(_ context.Context, buf []SourceRecord) (int, error) {
	if r.next >= len(r.s.recs) {
		return 0, io.EOF
	}
	n := copy(buf, r.s.recs[r.next:])
	r.next += n
	return n, nil
}
func (r *memReader) Positions() []Split {
	return []Split{{ID: "mem", Position: []byte(strconv.Itoa(r.next))}}
}
func (r *memReader) Close() error { return nil }

// memSink collects what it is given, by sink name (at least once; enough for a bounded run).
type memSink struct {
	mu   sync.Mutex
	recs []SinkRecord
}

func (s *memSink) Committer() SinkCommitter { return nil }
func (s *memSink) Open(context.Context, SinkContext) (SinkWriter, error) {
	return memWriter{s}, nil
}

type memWriter struct{ s *memSink }

func (w memWriter) Write(_ context.Context, recs []SinkRecord) error {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	for _, r := range recs {
		w.s.recs = append(w.s.recs, SinkRecord{Key: append([]byte(nil), r.Key...), Value: append([]byte(nil), r.Value...), Pos: r.Pos})
	}
	return nil
}
func (memWriter) PreCommit(context.Context, uint64) ([]byte, error) { return nil, nil }
func (memWriter) Close(context.Context) error                       { return nil }

// TestDeadLetters: with on_error dead-letter, a record whose guest call faults without
// effect goes to NAME.errors with a reason naming the operator and the record, and the job
// goes on; without it, the same fault fails the job. The module is host/abi's "fast": a value
// starting with 'c' counts and emits, one starting with 'b' faults in its frame write-back,
// before anything is written.
func TestDeadLetters(t *testing.T) {
	mod, err := filepath.Abs("../abi/testdata/fast.wasm")
	if err != nil {
		t.Fatal(err)
	}
	var recs []SourceRecord
	bad := map[int64]bool{}
	for i := range 600 {
		v := "c"
		if i%7 == 3 {
			v, bad[int64(i)] = "b", true
		}
		recs = append(recs, SourceRecord{Key: []byte(fmt.Sprintf("k%d", i%5)), Value: []byte(v), Pos: int64(i)})
	}
	run := func(onError string, retries int) (*memSink, *memSink, JobMetrics, error) {
		out, dead := &memSink{}, &memSink{}
		conns := &Connectors{}
		conns.RegisterSource("mem", func(*SourceSpec, *ConnectorOptions, *Env) (Source, error) { return &memSource{recs: recs}, nil })
		conns.RegisterSink("out", func(*SinkSpec, *ConnectorOptions, *Env) (Sink, error) { return out, nil })
		conns.RegisterSink("dead", func(*SinkSpec, *ConnectorOptions, *Env) (Sink, error) { return dead, nil })
		spec, err := ParseSpec([]byte(fmt.Sprintf(`
name: dl
sources: [{name: in, type: mem}]
operators: [{name: fast, module: %s, inputs: [in], key: {source: true}, parallelism: 2, on_error: %s, retries: %d}]
sinks:
  - {name: out, type: out, inputs: [fast]}
  - {name: dead, type: dead, inputs: [fast.errors]}
`, mod, onError, retries)))
		if err != nil {
			t.Fatal(err)
		}
		j, err := Start(context.Background(), spec, Env{Connectors: conns, StateURL: newMemPool(t)})
		if err != nil {
			t.Fatal(err)
		}
		m, err := j.Wait()
		return out, dead, m, err
	}
	// Each faulted record is run 3 times (2 retries) before it is dead-lettered: the fault is
	// deterministic here, so every attempt fails.
	out, dead, m, err := run("dead-letter", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.recs) != 600-len(bad) || len(dead.recs) != len(bad) {
		t.Fatalf("%d outputs and %d dead letters, want %d and %d", len(out.recs), len(dead.recs), 600-len(bad), len(bad))
	}
	seen := map[int64]bool{}
	for _, r := range dead.recs {
		var d struct {
			Operator, Key, Reason, Raw string
			Pos                        int64
			Attempts                   int
		}
		if err := json.Unmarshal(r.Value, &d); err != nil {
			t.Fatal(err)
		}
		if d.Operator != "fast" || !bad[d.Pos] || seen[d.Pos] || d.Raw != "b" || d.Attempts != 3 || d.Key != fmt.Sprintf("k%d", d.Pos%5) ||
			!strings.Contains(d.Reason, `operator "fast" failed at the record at source position `+strconv.FormatInt(d.Pos, 10)) {
			t.Fatalf("dead letter %s", r.Value)
		}
		seen[d.Pos] = true
	}
	var dl int64
	for _, o := range m.Operators {
		dl += o.DeadLetters
	}
	if dl != int64(len(bad)) {
		t.Fatalf("metrics count %d dead letters, want %d", dl, len(bad))
	}
	if _, _, _, err := run("fail", 0); err == nil || !strings.Contains(err.Error(), `operator "fast" failed`) {
		t.Fatalf("on_error fail: %v", err)
	}
}

func TestOnErrorSpec(t *testing.T) {
	for _, tc := range []struct{ onError, sinkInput, want string }{
		{"dead-letter", "op", "operators[0].on_error: dead letters go to op.errors, which nothing reads"},
		{"retry", "op", `operators[0].on_error: "retry" is not one of fail, dead-letter`},
	} {
		_, err := ParseSpec([]byte(fmt.Sprintf(`
name: x
sources: [{name: in, type: file, path: a.jsonl}]
operators: [{name: op, module: m.wasm, inputs: [in], on_error: %s}]
sinks: [{name: out, type: file, path: o.jsonl, inputs: [%s]}]
`, tc.onError, tc.sinkInput)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.onError, err, tc.want)
		}
	}
}

// TestFlagFormOnErrorDeadLetter: the flag form's OnError dead-letter writes the faulted records
// and the malformed lines to the one DeadLetter output, each a whole JSON line, also when an
// oversized line is streamed there in pieces while faulted records arrive.
func TestFlagFormOnErrorDeadLetter(t *testing.T) {
	var in strings.Builder
	big := strings.Repeat("x", 300<<10) // longer than the reader's buffer
	for i := range 300 {
		if i%50 == 7 {
			fmt.Fprintf(&in, "{\"u\":\"%s\"}\n", big) // over the record limit: streamed
			continue
		}
		fmt.Fprintf(&in, "{\"u\":\"k%d\"}\n", i%9)
	}
	var dl bytes.Buffer
	out, sum, err := runOpts(t, Options{Module: abiFixture(t, "trap"), KeyField: "u", OnError: "dead-letter", Retries: 1,
		OnMalformed: MalformedSkip, DeadLetter: &dl, Limits: abi.Limits{MaxRecordValue: 1024}}, in.String())
	if err != nil || out != "" || sum.DeadLetters != 294 || sum.Skipped != 6 {
		t.Fatalf("%v %q dead %d skipped %d", err, out, sum.DeadLetters, sum.Skipped)
	}
	seen := map[int64]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(dl.String(), "\n"), "\n") {
		var d struct {
			Line      int64
			Operator  string
			Attempts  int
			RawBase64 string `json:"raw_base64"`
		}
		if err := json.Unmarshal([]byte(l), &d); err != nil || seen[d.Line] {
			t.Fatalf("dead letter %.200q: %v", l, err)
		}
		seen[d.Line] = true
		if oversize := (d.Line-1)%50 == 7; oversize != (d.Operator == "") || (!oversize && (d.Operator != "trapper" || d.Attempts != 2)) ||
			(oversize && d.RawBase64 == "") {
			t.Fatalf("line %d: %.200s", d.Line, l)
		}
	}
	if len(seen) != 300 {
		t.Fatalf("%d dead letters, want 300", len(seen))
	}
	// Dead letters need somewhere to go; the policies are checked.
	for _, o := range []Options{{OnError: "dead-letter"}, {OnError: "skip"}, {Retries: 11}} {
		o.Module, o.KeyField = abiFixture(t, "trap"), "u"
		if _, _, err := runOpts(t, o, "{\"u\":\"a\"}\n"); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
