package abi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tetratelabs/wazero"
)

// The on-disk compilation cache
//
// wazero keeps one file per compiled module in its cache directory, named by a hash of the
// module, the wazero version and the CPU's features, and reads it back on the next compile. A
// damaged file (truncated by a full disk, or changed on disk) is detected when it is read (its
// length or its checksum is wrong), but wazero then fails the compile and leaves the file in
// place, so the module could never be loaded again on that machine.
//
// compile recovers. When a compile fails on an engine with an on-disk cache, the module is
// compiled again by a throwaway runtime whose cache is an empty directory beside the real one.
// If that fails too, the module itself is at fault and that error is returned. Otherwise the
// throwaway cache now holds exactly one file, the good entry, under the same relative path as
// the damaged one (the name depends only on the module and the machine), and it is renamed over
// the damaged entry: an atomic replacement that is safe against other processes reading the
// cache. The engine then compiles once more, from the repaired entry.
//
// wazero's checksum covers the machine code, not the function offsets in front of it, so a
// changed offset is not detected; the directory is the host's own (docs/DESIGN.md).

// compile compiles bin, repairing a damaged cache entry once if there is one.
func (e *Engine) compile(ctx context.Context, bin []byte) (wazero.CompiledModule, error) {
	compiled, err := e.rt.CompileModule(ctx, bin)
	if err == nil || e.dir == "" {
		return compiled, err
	}
	if rerr := e.repairCacheEntry(ctx, bin); rerr != nil {
		return nil, rerr
	}
	compiled, err = e.rt.CompileModule(ctx, bin)
	if err != nil {
		return nil, fmt.Errorf("compiling after replacing a damaged compilation cache entry: %w", err)
	}
	return compiled, nil
}

// errNoCacheEntry means a fresh compile left no cache entry to replace a damaged one with.
var errNoCacheEntry = errors.New("abi: a fresh compile wrote no compilation cache entry")

// repairCacheEntry compiles bin into an empty cache next to e.dir and moves the entry it writes
// over the one in e.dir. It returns the compile error if bin does not compile on its own.
func (e *Engine) repairCacheEntry(ctx context.Context, bin []byte) error {
	tmp, err := os.MkdirTemp(e.dir, ".repair-")
	if err != nil {
		return fmt.Errorf("abi: compilation cache in %s: %w", e.dir, err)
	}
	defer os.RemoveAll(tmp)
	cc, err := wazero.NewCompilationCacheWithDir(tmp)
	if err != nil {
		return fmt.Errorf("abi: compilation cache in %s: %w", tmp, err)
	}
	rt := wazero.NewRuntimeWithConfig(ctx, e.runtimeConfig(cc))
	_, err = rt.CompileModule(ctx, bin)
	err = errors.Join(err, rt.Close(ctx), cc.Close(ctx))
	if err != nil {
		return err
	}
	var entry string
	err = filepath.WalkDir(tmp, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if entry != "" {
				return fmt.Errorf("abi: a fresh compile wrote more than one cache entry (%s, %s)", entry, p)
			}
			entry = p
		}
		return err
	})
	if err != nil {
		return err
	}
	if entry == "" {
		return errNoCacheEntry
	}
	rel, err := filepath.Rel(tmp, entry)
	if err != nil {
		return err
	}
	if err := os.Rename(entry, filepath.Join(e.dir, rel)); err != nil {
		return fmt.Errorf("abi: replacing a damaged compilation cache entry: %w", err)
	}
	return nil
}
