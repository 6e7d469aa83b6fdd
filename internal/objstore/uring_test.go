//go:build unix

package objstore

import (
	"context"
	"errors"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/uring"
)

// TestUringReads: with the io_uring reader, the file pool serves the same ranges of an
// immutable object as with pread, and objects that are not immutable still read whole.
func TestUringReads(t *testing.T) {
	r, err := NewUringReader()
	if errors.Is(err, uring.ErrUnavailable) {
		t.Skipf("io_uring: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f, err := OpenFile(t.TempDir(), FileOptions{ImmutableSuffix: ".seg", Reader: r})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := make([]byte, 100_000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, name := range []string{"a.seg", "b"} {
		if _, err := f.Put(ctx, name, data, Cond{}); err != nil {
			t.Fatal(err)
		}
		for _, c := range [][2]int64{{0, -1}, {1, 10}, {4096, 8192}, {99_990, 100}, {100_000, -1}} {
			got, err := f.Get(ctx, name, c[0], c[1])
			end := int64(len(data))
			if c[1] >= 0 && c[0]+c[1] < end {
				end = c[0] + c[1]
			}
			if err != nil || string(got) != string(data[c[0]:end]) {
				t.Fatalf("%s [%d,+%d): %d bytes, %v", name, c[0], c[1], len(got), err)
			}
		}
	}
}
