package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/clink-wasm/clink-wasm/host/devkit"
)

// cmdNew scaffolds an operator project (host/devkit.Scaffold).
func cmdNew(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("new", "new --lang go|as|c|rust [--sdk DIR] NAME", stderr)
	lang := fs.String("lang", "", "the operator's language: "+strings.Join(devkit.Languages, ", "))
	sdk := fs.String("sdk", "", "the guest-sdk directory of a clink-wasm checkout (default: $CLINK_SDK, else found above the working directory or this executable)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 1 { // flags after NAME
		name := fs.Arg(0)
		if err := parse(fs, fs.Args()[1:]); err != nil {
			return err
		}
		if fs.NArg() != 0 {
			return usagef("new: give one project name")
		}
		return scaffold(*lang, *sdk, name, stdout)
	}
	if fs.NArg() != 1 {
		return usagef("new: give one project name")
	}
	return scaffold(*lang, *sdk, fs.Arg(0), stdout)
}

func scaffold(lang, sdk, name string, stdout io.Writer) error {
	if !slices.Contains(devkit.Languages, lang) {
		return usagef("new: give --lang, one of %s", strings.Join(devkit.Languages, ", "))
	}
	var start []string
	if wd, err := os.Getwd(); err == nil {
		start = append(start, wd)
	}
	if exe, err := os.Executable(); err == nil {
		start = append(start, filepath.Dir(exe))
	}
	dir, err := devkit.FindSDK(sdk, start...)
	if err != nil {
		return err
	}
	p, err := devkit.Scaffold(name, lang, filepath.Base(name), dir)
	if err != nil {
		return fmt.Errorf("new: %w", err)
	}
	fmt.Fprintf(stdout, "created %s: a %s operator (%s), its manifest, a test table and a README\n\n", name, lang, devkit.Source(lang))
	fmt.Fprintf(stdout, "  cd %s\n  clink-wasm build\n  clink-wasm test\n  clink-wasm run --module %s --input input.jsonl --key %s\n", name, p.Module(), p.Key)
	return nil
}
