package ingest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestLogRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 3000)
	batch := func(i int) []byte {
		var b strings.Builder
		for j := 0; j < 4; j++ {
			fmt.Fprintf(&b, "{\"b\":%d,\"r\":%d,\"pad\":%q}\n", i, j, big)
		}
		return []byte(b.String())
	}
	var offs []int64
	for i := 0; i < 3; i++ {
		res, err := l.Append(fmt.Sprintf("k%d", i), batch(i))
		if err != nil {
			t.Fatal(err)
		}
		offs = append(offs, res.Offset)
	}
	blocks := func() int64 {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return st.Sys().(*syscall.Stat_t).Blocks
	}
	before := blocks()
	// A checkpoint covers batch 0 and half of batch 1.
	r, _ := l.NewReader(0, 0)
	buf := make([]Record, 6)
	if n, err := r.Next(context.Background(), buf); n != 6 || err != nil {
		t.Fatalf("%d %v", n, err)
	}
	pos, left := r.Pos()
	r.Close()
	if err := l.Release(pos); err != nil {
		t.Fatal(err)
	}
	if l.Start() != offs[1] {
		t.Fatalf("start %d, want batch 1 at %d", l.Start(), offs[1])
	}
	if blocks() >= before {
		t.Errorf("no disk space freed: %d blocks before, %d after", before, blocks())
	}
	if _, err := l.NewReader(offs[0]+10, 1); err == nil {
		t.Fatal("a reader opened inside the released part")
	}
	got, _, _ := readAll(t, l, pos, left)
	if len(got) != 6 || !strings.HasPrefix(got[0], `{"b":1,"r":2,`) {
		t.Fatalf("after release: %d records, first %.20s", len(got), got[0])
	}
	l.Close()
	// The start survives a reopen; recovery scans from it; a fresh reader begins there.
	l, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Start() != offs[1] || l.Durable() != offs[2]+int64(len(batch(2)))+int64(len("#b k2 ")+len(fmt.Sprint(len(batch(2))))+len(" 4\n")) {
		t.Fatalf("reopened: start %d durable %d", l.Start(), l.Durable())
	}
	got, _, _ = readAll(t, l, 0, 0)
	if len(got) != 8 || !strings.HasPrefix(got[0], `{"b":1,"r":0,`) {
		t.Fatalf("from the start: %d records", len(got))
	}
	if res, err := l.Append("k1", batch(1)); err != nil || !res.Duplicate {
		t.Fatalf("a kept batch's key: %+v %v", res, err)
	}
}
