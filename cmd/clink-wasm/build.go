package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/clink-wasm/clink-wasm/host/devkit"
)

// cmdBuild builds the project in the working directory (host/devkit.Build) and prints what
// inspect would.
func cmdBuild(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("build", "build [DIR]   (in a project made by clink-wasm new; DIR defaults to .)", stderr)
	if err := parse(fs, args); err != nil {
		return err
	}
	dir, err := projectDir(fs.Args())
	if err != nil {
		return err
	}
	res, err := devkit.Build(ctx, dir)
	if res != nil {
		fmt.Fprintf(stdout, "built with %s\n", res.Toolchain)
		printReport(stdout, res.Module, res.Report)
	}
	return err
}

func projectDir(args []string) (string, error) {
	switch len(args) {
	case 0:
		return ".", nil
	case 1:
		return filepath.Clean(args[0]), nil
	}
	return "", usagef("give at most one project directory")
}

// cmdTest runs the project's test table (host/devkit.Test).
func cmdTest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("test", "test [DIR] [--table FILE] [--module M.wasm]   (in a project made by clink-wasm new; DIR defaults to .)", stderr)
	table := fs.String("table", "", "the test table to run (default: the project's tests.json), e.g. one written by clink-wasm replay --cases")
	module := fs.String("module", "", "the module to test (default: the project's built module); with --table, no project is needed")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *module != "" {
		if *table == "" {
			return usagef("test: --module needs --table FILE")
		}
		if len(fs.Args()) > 0 {
			return usagef("test: give a project directory or --module, not both")
		}
		_, err := devkit.TestFiles(ctx, *module, *table, "", stdout)
		return err
	}
	dir, err := projectDir(fs.Args())
	if err != nil {
		return err
	}
	_, err = devkit.TestTable(ctx, dir, *table, stdout)
	if errors.Is(err, devkit.ErrFailed) {
		return err // the report is on stdout; exit status 1
	}
	return err
}
