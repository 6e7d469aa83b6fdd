package ingest

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// settle waits for the extension of the allocated space in flight, if any.
func settle(l *Log) {
	l.mu.Lock()
	l.harvest(true)
	l.mu.Unlock()
}

// openWithOne opens a new log, appends one batch and waits for its zeros ahead.
func openWithOne(t *testing.T) (*Log, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "log")
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append("k1", []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	settle(l)
	return l, path
}

// zerosAfter fails unless every byte of the file at path from off on is zero.
func zerosAfter(t *testing.T, path string, off int64) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) < off {
		t.Fatalf("file of %d bytes, durable length %d", len(b), off)
	}
	if i := bytes.IndexFunc(b[off:], func(r rune) bool { return r != 0 }); i >= 0 {
		t.Fatalf("a non-zero byte at %d, past the durable length %d", off+int64(i), off)
	}
	return int64(len(b))
}

// Appends land in zeros written ahead of the durable length (so they need only fdatasync): the
// file does not grow with each one, and a reopen finds exactly the batches.
func TestLogPreallocated(t *testing.T) {
	l, path := openWithOne(t)
	size := zerosAfter(t, path, l.Durable())
	if size < l.Durable()+PreallocBytes/2 {
		t.Fatalf("file of %d bytes: nothing allocated past the durable length %d", size, l.Durable())
	}
	for i := 0; i < 20; i++ {
		if _, err := l.Append("", []byte(`{"a":2}`+"\n"+`{"a":3}`)); err != nil {
			t.Fatal(err)
		}
	}
	if got := zerosAfter(t, path, l.Durable()); got != size {
		t.Fatalf("appends inside the allocated space grew the file from %d to %d bytes", size, got)
	}
	durable := l.Durable()
	l.Close()

	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Durable() != durable {
		t.Fatalf("reopened at %d, want %d", l.Durable(), durable)
	}
	got, _, _ := readAll(t, l, 0, 0)
	if len(got) != 41 || got[0] != `{"a":1}` || got[40] != `{"a":3}` {
		t.Fatalf("read %d records: %v", len(got), got)
	}
	if res, err := l.Append("k1", []byte(`{"a":1}`)); err != nil || !res.Duplicate {
		t.Fatalf("key after reopen: %+v %v", res, err)
	}
}

// A batch torn inside the allocated space (a crash during an unacknowledged write: some of its
// pages are still zeros) ends the log on open, and its pages that did reach the disk are zeroed,
// so a later torn write cannot expose them.
func TestLogTornInPreallocated(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   int64 // where the torn write's surviving bytes are, past the durable length
		data string
	}{
		{"body cut short", 0, "#b k9 5000 3\n" + `{"a":9}` + "\n"},
		{"header cut short", 0, "#b k9 50"},
		{"first page missing", 8192, strings.Repeat(`{"a":9}`+"\n", 100)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, path := openWithOne(t)
			durable := l.Durable()
			l.Close()
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte(tc.data), durable+tc.at); err != nil {
				t.Fatal(err)
			}
			f.Close()

			l, err = Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if l.Durable() != durable {
				t.Fatalf("reopened at %d, want %d (the torn batch cut away)", l.Durable(), durable)
			}
			zerosAfter(t, path, durable)
			if res, err := l.Append("k9", []byte(`{"a":2}`)); err != nil || res.Duplicate {
				t.Fatalf("the torn batch's key must not count: %+v %v", res, err)
			}
			l.Close()
			l, err = Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if got, _, _ := readAll(t, l, 0, 0); strings.Join(got, ",") != `{"a":1},{"a":2}` {
				t.Fatalf("after the torn tail: %v", got)
			}
		})
	}
}
