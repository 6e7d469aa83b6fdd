package ingest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readAll(t *testing.T, l *Log, off int64, left int) ([]string, int64, int) {
	t.Helper()
	r, err := l.NewReader(off, left)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got []string
	buf := make([]Record, 2)
	for r.pos < l.Durable() {
		n, err := r.Next(context.Background(), buf)
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range buf[:n] {
			got = append(got, string(rec.Value))
		}
	}
	o, lf := r.Pos()
	return got, o, lf
}

func TestLogAppendReadResume(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append("k1", []byte("{\"a\":1}\n\n{ \"a\" : 2 }\n{\"a\":3}")); err != nil {
		t.Fatal(err)
	}
	res, err := l.Append("k1", []byte(`{"a":99}`))
	if err != nil || !res.Duplicate || res.Records != 3 {
		t.Fatalf("retry: %+v %v", res, err)
	}
	if _, err := l.Append("", []byte(`{"a":4}`)); err != nil {
		t.Fatal(err)
	}
	var bad *BadRecordError
	if _, err := l.Append("k2", []byte("{\"a\":5}\n[1]\n")); !errors.As(err, &bad) || bad.Line != 2 {
		t.Fatalf("bad record: %v", err)
	}
	got, _, _ := readAll(t, l, 0, 0)
	if strings.Join(got, ",") != `{"a":1},{"a":2},{"a":3},{"a":4}` {
		t.Fatalf("read %v", got)
	}
	// Resume in the middle of the first batch.
	r, _ := l.NewReader(0, 0)
	buf := make([]Record, 2)
	if n, err := r.Next(context.Background(), buf); n != 2 || err != nil {
		t.Fatalf("%d %v", n, err)
	}
	off, left := r.Pos()
	r.Close()
	if left != 1 {
		t.Fatalf("left %d", left)
	}
	got, _, _ = readAll(t, l, off, left)
	if strings.Join(got, ",") != `{"a":3},{"a":4}` {
		t.Fatalf("resumed %v", got)
	}
	l.Close()

	// A torn tail (a crash during an unacknowledged write) is cut away on open, and the keys
	// survive.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("#b k3 100 2\n{\"a\":6}\n")
	f.Close()
	l, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got, _, _ = readAll(t, l, 0, 0)
	if len(got) != 4 {
		t.Fatalf("after torn tail: %v", got)
	}
	if res, err := l.Append("k1", []byte(`{"a":1}`)); err != nil || !res.Duplicate {
		t.Fatalf("key after reopen: %+v %v", res, err)
	}
	if res, err := l.Append("k3", []byte(`{"a":6}`)); err != nil || res.Duplicate {
		t.Fatalf("torn batch's key must not count: %+v %v", res, err)
	}
}

func TestLogBackpressure(t *testing.T) {
	l, err := Open(filepath.Join(t.TempDir(), "log"), Options{MaxLagBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rec := []byte(`{"k":"0123456789012345678901234567890123456789"}`)
	if _, err := l.Append("", rec); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append("", rec); !errors.Is(err, ErrBackpressure) {
		t.Fatalf("want backpressure, got %v", err)
	}
	r, _ := l.NewReader(0, 0)
	defer r.Close()
	buf := make([]Record, 8)
	if n, _ := r.Next(context.Background(), buf); n != 1 {
		t.Fatalf("read %d", n)
	}
	if _, err := l.Append("", rec); err != nil {
		t.Fatalf("after the reader caught up: %v", err)
	}
}
