package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

func testPreview(t *testing.T, dir string, maxBytes int) *previewSink {
	t.Helper()
	o := pipeline.NewOptions("sinks[0]", map[string]any{"max_bytes": maxBytes})
	s, err := newPreviewSink(dir, &pipeline.SinkSpec{Name: "out"}, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Finish(); err != nil {
		t.Fatal(err)
	}
	return s
}

// checkpointN writes lines [from, to) through two subtasks and prepares checkpoint n.
func checkpointN(t *testing.T, s *previewSink, ws []*previewWriter, n uint64, from, to int) []byte {
	t.Helper()
	ctx := context.Background()
	for i := from; i < to; i++ {
		v := fmt.Appendf(nil, `{"seq":%d,"pad":"%s"}`, i, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")
		if err := ws[i%2].Write(ctx, []pipeline.SinkRecord{{Value: v}}); err != nil {
			t.Fatal(err)
		}
	}
	var hs [][]byte
	for _, w := range ws {
		h, err := w.PreCommit(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	prep, err := s.Prepare(ctx, n, hs)
	if err != nil {
		t.Fatal(err)
	}
	return prep
}

func seqs(t *testing.T, lines [][]byte) []int {
	var out []int
	for _, l := range lines {
		var v struct{ Seq int }
		if _, err := fmt.Sscanf(string(l), `{"seq":%d,`, &v.Seq); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		out = append(out, v.Seq)
	}
	slices.Sort(out)
	return out
}

func dirBytes(t *testing.T, dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			n += info.Size()
		}
		return nil
	})
	return n
}

// TestPreviewRotates: the preview stays within 2 × max_bytes plus a checkpoint's output, keeps
// the latest lines, and a follower sees every committed line once across rotations; a restore
// to an earlier checkpoint cuts newer generations away.
func TestPreviewRotates(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s := testPreview(t, dir, 1024)
	if err := s.Recover(ctx, 0, nil); err != nil {
		t.Fatal(err)
	}
	var ws []*previewWriter
	for i := range 2 {
		w, err := s.Open(ctx, pipeline.SinkContext{Subtask: i})
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w.(*previewWriter))
	}
	var followed []int
	var cur Cursor
	var preps [][]byte
	const perCP, cps = 10, 40 // ~600 bytes a checkpoint, 24 KiB in all
	for n := 1; n <= cps; n++ {
		prep := checkpointN(t, s, ws, uint64(n), (n-1)*perCP, n*perCP)
		preps = append(preps, prep)
		if err := s.Commit(ctx, uint64(n), prep); err != nil {
			t.Fatal(err)
		}
		lines, next, err := FollowPreview(dir, "out", cur, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		cur = next
		followed = append(followed, seqs(t, lines)...)
		if got, bound := dirBytes(t, dir), int64(2*1024+2*perCP*64); got > bound {
			t.Fatalf("after checkpoint %d the preview holds %d bytes, over %d", n, got, bound)
		}
	}
	gens, _ := generations(dir, "out")
	if len(gens) != 2 || gens[1] < 10 {
		t.Fatalf("generations %v: want the two newest of many", gens)
	}
	slices.Sort(followed)
	if want := seqRange(0, cps*perCP); !slices.Equal(followed, want) {
		t.Fatalf("followed %d lines, want each of %d once", len(followed), len(want))
	}
	lines, _, err := TailPreview(dir, "out", 2*perCP, 1<<20) // whole checkpoints: within one, lines go by subtask
	if err != nil {
		t.Fatal(err)
	}
	if got := seqs(t, lines); !slices.Equal(got, seqRange(cps*perCP-2*perCP, cps*perCP)) {
		t.Fatalf("tail: %v", got)
	}
	// A crash after checkpoint 41 was prepared and committed, restored to checkpoint 40.
	prep41 := checkpointN(t, s, ws, 41, cps*perCP, (cps+3)*perCP)
	if err := s.Commit(ctx, 41, prep41); err != nil {
		t.Fatal(err)
	}
	s2 := testPreview(t, dir, 1024)
	if err := s2.Recover(ctx, 40, preps[cps-1]); err != nil {
		t.Fatal(err)
	}
	lines, _, _ = TailPreview(dir, "out", perCP, 1<<20)
	if got := seqs(t, lines); !slices.Equal(got, seqRange(cps*perCP-perCP, cps*perCP)) {
		t.Fatalf("after the restore the tail is %v: checkpoint 41's output survived", got)
	}
	// Bad max_bytes is refused, naming the field.
	o := pipeline.NewOptions("sinks[0]", map[string]any{"max_bytes": 10})
	newPreviewSink("", &pipeline.SinkSpec{Name: "out"}, o)
	if err := o.Finish(); err == nil {
		t.Fatal("max_bytes 10 was accepted")
	}
}

func seqRange(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// TestPreviewLost: a restore whose preview files are gone (a lost run directory) starts an
// empty preview in a new generation instead of failing, and commits go on from there.
func TestPreviewLost(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s := testPreview(t, dir, 1024)
	if err := s.Recover(ctx, 0, nil); err != nil {
		t.Fatal(err)
	}
	w, _ := s.Open(ctx, pipeline.SinkContext{})
	ws := []*previewWriter{w.(*previewWriter), w.(*previewWriter)}
	prep := checkpointN(t, s, ws, 1, 0, 10)
	if err := s.Commit(ctx, 1, prep); err != nil {
		t.Fatal(err)
	}
	prep2 := checkpointN(t, s, ws, 2, 10, 20)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	s2 := testPreview(t, dir, 1024)
	if err := s2.Recover(ctx, 2, prep2); err != nil {
		t.Fatalf("a restore over a lost preview: %v", err)
	}
	if lines, _, _ := TailPreview(dir, "out", 100, 1<<20); len(lines) != 0 {
		t.Fatalf("a lost preview came back with %d lines", len(lines))
	}
	w2, _ := s2.Open(ctx, pipeline.SinkContext{})
	ws2 := []*previewWriter{w2.(*previewWriter), w2.(*previewWriter)}
	if err := s2.Commit(ctx, 3, checkpointN(t, s2, ws2, 3, 20, 30)); err != nil {
		t.Fatal(err)
	}
	lines, _, _ := TailPreview(dir, "out", 100, 1<<20)
	if got := seqs(t, lines); !slices.Equal(got, seqRange(20, 30)) {
		t.Fatalf("after the loss: %v", got)
	}
}

// TestPreviewPreparedFormat: checkpoint records written before the preview sink shared the
// file sink's Parts hold flat gen/base/end/parts fields; they still decode, and new ones are
// written the same way.
func TestPreviewPreparedFormat(t *testing.T) {
	const old = `{"gen":2,"base":10,"end":25,"parts":["00000000000000000007-00000.part"]}`
	var p previewPrepared
	if err := json.Unmarshal([]byte(old), &p); err != nil {
		t.Fatal(err)
	}
	if p.Gen != 2 || p.Base != 10 || p.End != 25 || len(p.Parts.Parts) != 1 || p.Parts.Parts[0] != "00000000000000000007-00000.part" {
		t.Fatalf("decoded %+v", p)
	}
	b, err := json.Marshal(p)
	if err != nil || string(b) != old {
		t.Fatalf("encoded %s (%v), want %s", b, err, old)
	}
}
