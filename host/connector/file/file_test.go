package file

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

func open(t *testing.T, src pipeline.Source, splits []pipeline.Split) pipeline.SourceReader {
	t.Helper()
	r, err := src.Open(context.Background(), splits)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// readAll reads records with a buffer of n, returning values and malformed errors.
func readAll(t *testing.T, r pipeline.SourceReader, n int, stopAfter int) ([]string, []pipeline.Split) {
	t.Helper()
	buf := make([]pipeline.SourceRecord, n)
	var out []string
	for {
		k, err := r.Read(context.Background(), buf[:min(n, max(1, stopAfter-len(out)))])
		for _, rec := range buf[:k] {
			if rec.Malformed != nil {
				out = append(out, "BAD "+rec.Malformed.Error())
			} else {
				out = append(out, string(rec.Value))
			}
		}
		if err == io.EOF || (stopAfter > 0 && len(out) >= stopAfter) {
			return out, r.Positions()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func newSource(t *testing.T, path string, opts map[string]any) pipeline.Source {
	t.Helper()
	o := map[string]any{"path": path}
	for k, v := range opts {
		o[k] = v
	}
	co := pipeline.NewOptions("sources[0]", o)
	s, err := NewSource(&pipeline.SourceSpec{Name: "in"}, co, &pipeline.Env{})
	if err == nil {
		err = co.Finish()
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSourceResume: reading from any checkpointed position gives exactly the rest, for JSON
// Lines (with blank and malformed lines) and CSV (with quoted newlines), over two files.
func TestSourceResume(t *testing.T) {
	dir := t.TempDir()
	jl := "{\"a\":1}\n\n{\"a\":2}\nnot json\n{\"a\":3}\r\n[1]\n{\"a\":4}"
	csv := "name,n\n\"multi\nline\",1\nbob,2\n\"q\"\"uote\",3.5\n"
	os.WriteFile(filepath.Join(dir, "1.jsonl"), []byte(jl), 0o644)
	os.WriteFile(filepath.Join(dir, "2.jsonl"), []byte("{\"b\":1}\n{\"b\":2}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "c.csv"), []byte(csv), 0o644)
	for _, c := range []struct {
		path string
		want []string
	}{
		{"*.jsonl", []string{`{"a":1}`, `{"a":2}`, "BAD 1.jsonl: line 4 is not valid JSON", `{"a":3}`, "BAD 1.jsonl: line 6: a record must be a JSON object", `{"a":4}`, `{"b":1}`, `{"b":2}`}},
		{"c.csv", []string{`{"name":"multi\nline","n":1}`, `{"name":"bob","n":2}`, `{"name":"q\"uote","n":3.5}`}},
	} {
		src := newSource(t, filepath.Join(dir, c.path), nil)
		ids, _ := src.Splits(context.Background())
		var splits []pipeline.Split
		for _, id := range ids {
			splits = append(splits, pipeline.Split{ID: id})
		}
		all, _ := readAll(t, open(t, src, splits), 3, 0)
		if !slices.Equal(all, c.want) {
			t.Fatalf("%s: got %q\nwant %q", c.path, all, c.want)
		}
		for cut := 1; cut < len(c.want); cut++ {
			first, pos := readAll(t, open(t, src, splits), 1, cut)
			rest, _ := readAll(t, open(t, src, pos), 2, 0)
			if got := append(first, rest...); !slices.Equal(got, c.want) {
				t.Fatalf("%s cut at %d (positions %s): got %q", c.path, cut, pos, got)
			}
		}
	}
}

func TestSourceChangedInput(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "in.jsonl")
	os.WriteFile(p, []byte("{\"a\":1}\n{\"a\":2}\n"), 0o644)
	src := newSource(t, p, nil)
	r := open(t, src, []pipeline.Split{{ID: p, Position: []byte(`{"offset":100,"line":9}`)}})
	_, err := r.Read(context.Background(), make([]pipeline.SourceRecord, 4))
	if err == nil || !strings.Contains(err.Error(), "the input changed") {
		t.Fatalf("want a changed-input error, got %v", err)
	}
}

// TestSinkCommitIdempotent: a commit repeated after a crash in the middle (output partly
// appended, parts still there) ends with the same output; Recover drops uncommitted parts.
func TestSinkCommitIdempotent(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	co := pipeline.NewOptions("sinks[0]", map[string]any{"path": out, "fsync": false})
	sk, err := NewSink(&pipeline.SinkSpec{Name: "out"}, co, &pipeline.Env{})
	if err != nil || co.Finish() != nil {
		t.Fatal(err, co.Finish())
	}
	s := sk.(*Sink)
	ctx := context.Background()
	if err := s.Recover(ctx, 0, nil); err != nil {
		t.Fatal(err)
	}
	w0, _ := s.Open(ctx, pipeline.SinkContext{Subtask: 0})
	w1, _ := s.Open(ctx, pipeline.SinkContext{Subtask: 1})
	w0.Write(ctx, []pipeline.SinkRecord{{Value: []byte(`{"x":1}`)}, {Value: []byte("{\n\"x\": 2}")}})
	w1.Write(ctx, []pipeline.SinkRecord{{Value: []byte(`{"y":1}`)}})
	h0, _ := w0.PreCommit(ctx, 5)
	h1, _ := w1.PreCommit(ctx, 5)
	prep, err := s.Prepare(ctx, 5, [][]byte{h0, h1})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(out); len(b) != 0 {
		t.Fatalf("pre-committed output is visible: %q", b)
	}
	// A crash mid-append: half of the first part made it.
	os.WriteFile(out, []byte(`{"x":1`), 0o644)
	for range 2 {
		if err := s.Commit(ctx, 5, prep); err != nil {
			t.Fatal(err)
		}
	}
	want := "{\"x\":1}\n{\"x\":2}\n{\"y\":1}\n"
	if b, _ := os.ReadFile(out); string(b) != want {
		t.Fatalf("output %q", b)
	}
	// Uncommitted output of checkpoint 6 is dropped by a recovery to 5.
	w0.Write(ctx, []pipeline.SinkRecord{{Value: []byte(`{"x":3}`)}})
	h0, _ = w0.PreCommit(ctx, 6)
	w0.Write(ctx, []pipeline.SinkRecord{{Value: []byte(`{"x":4}`)}}) // in progress
	if _, err := s.Prepare(ctx, 6, [][]byte{h0, h1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Recover(ctx, 5, prep); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(out); string(b) != want {
		t.Fatalf("output after recovery %q", b)
	}
	if ents, _ := os.ReadDir(s.pending); len(ents) != 0 {
		t.Fatalf("pending files left: %v", ents)
	}
	// Output that is not JSON is refused.
	if err := w1.Write(ctx, []pipeline.SinkRecord{{Value: []byte(`{"y":`)}}); err == nil {
		t.Fatal("invalid JSON accepted")
	}
}
