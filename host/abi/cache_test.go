package abi

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cacheEntries lists the files of an on-disk compilation cache.
func cacheEntries(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestCorruptCacheEntryRecompiles is issue 9's "a truncated file in the compilation cache makes
// the module unusable forever": a damaged entry is dropped and the module compiled again, and the
// entry on disk is good afterwards.
func TestCorruptCacheEntryRecompiles(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		damage func(b []byte) []byte
	}{
		{"empty", func(b []byte) []byte { return nil }},
		{"truncated in the header", func(b []byte) []byte { return b[:9] }},
		{"truncated in the code", func(b []byte) []byte { return b[:len(b)/2] }},
		{"truncated at the end", func(b []byte) []byte { return b[:len(b)-1] }},
		{"flipped code byte", func(b []byte) []byte { b[len(b)/2] ^= 0xff; return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			e, err := NewEngine(ctx, WithCompilationCacheDir(dir))
			if err != nil {
				t.Fatal(err)
			}
			load(t, e, "counter")
			e.Close(ctx)
			files := cacheEntries(t, dir)
			if len(files) != 1 {
				t.Fatalf("want one cache entry after compiling one module, got %v", files)
			}
			good, err := os.ReadFile(files[0])
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(files[0], tc.damage(append([]byte(nil), good...)), 0o600); err != nil {
				t.Fatal(err)
			}

			for run := 0; run < 2; run++ { // the second run reads the repaired entry
				e, err := NewEngine(ctx, WithCompilationCacheDir(dir))
				if err != nil {
					t.Fatal(err)
				}
				m := load(t, e, "counter")
				h := newRec()
				in, err := m.Instantiate(ctx, h)
				if err != nil {
					t.Fatal(err)
				}
				if err := in.Process([]byte("k"), []byte("{}"), 0); err != nil {
					t.Fatalf("run %d: %v", run, err)
				}
				in.Close(ctx)
				e.Close(ctx)
				if files := cacheEntries(t, dir); len(files) != 1 {
					t.Fatalf("run %d: cache holds %v, want the one entry", run, files)
				}
				if now, _ := os.ReadFile(files[0]); len(now) != len(good) {
					t.Fatalf("run %d: the cache entry is %d bytes, want the %d of a good one", run, len(now), len(good))
				}
			}
		})
	}
}

// TestCacheRepairKeepsModuleErrors: on an engine with an on-disk cache, a module that does not
// compile still fails with its own error, and the repair attempt leaves nothing behind.
func TestCacheRepairKeepsModuleErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	e, err := NewEngine(ctx, WithCompilationCacheDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	// A valid module whose function body does not validate (it returns nothing but declares an
	// i32 result): wasmbin accepts it, wazero's compile refuses it.
	bin := []byte("\x00asm\x01\x00\x00\x00" +
		"\x01\x05\x01\x60\x00\x01\x7f" + // type 0: () -> i32
		"\x03\x02\x01\x00" + // func 0: type 0
		"\x0a\x04\x01\x02\x00\x0b") // body: no locals, end
	_, err = e.Load(ctx, bin)
	var le *LoadError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "invalid WebAssembly module") {
		t.Fatalf("want a LoadError for an invalid module, got %v", err)
	}
	if files := cacheEntries(t, dir); len(files) != 0 {
		t.Fatalf("cache holds %v after a failed compile", files)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".repair-*")); len(left) != 0 {
		t.Fatalf("repair left %v", left)
	}
}
