package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

func cmdInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("inspect", "inspect [--json] OP.wasm", stderr)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("inspect: give exactly one module file (clink-wasm inspect [--json] OP.wasm)")
	}
	path := pos[0]
	bin, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading module: %w", err)
	}
	eng, err := abi.NewEngine(ctx)
	if err != nil {
		return err
	}
	defer eng.Close(ctx)
	rep := eng.Inspect(ctx, bin)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(jsonReport(path, rep)); err != nil {
			return err
		}
	} else {
		printReport(stdout, path, rep)
	}
	if !rep.Usable() {
		return fmt.Errorf("%s is not usable (%d problem%s)", path, len(rep.Problems), plural(len(rep.Problems)))
	}
	return nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func printReport(w io.Writer, path string, rep *abi.Report) {
	fmt.Fprintf(w, "module:     %s (%d bytes)\n", path, rep.Size)
	if rep.ABIVersion != 0 {
		fmt.Fprintf(w, "abi:        v%d\n", rep.ABIVersion)
	} else {
		fmt.Fprintln(w, "abi:        unknown")
	}
	if m := rep.Manifest; m != nil {
		fmt.Fprintf(w, "operator:   %s\n", m.Name)
		fmt.Fprintf(w, "manifest:   from %s\n", rep.ManifestSource)
		fmt.Fprintf(w, "states:     %s\n", listOrNone(m.States))
		if len(m.Prefetch) > 0 {
			fmt.Fprintf(w, "prefetch:   %s\n", listOrNone(m.Prefetch))
		}
		fmt.Fprintf(w, "endpoints:  %s\n", listOrNone(m.Endpoints))
	}
	if rep.Memory != "" {
		fmt.Fprintf(w, "memory:     %s\n", rep.Memory)
	}
	fmt.Fprintf(w, "imports:    %d\n", len(rep.Imports))
	for _, f := range rep.Imports {
		fmt.Fprintf(w, "  %s\n", f)
	}
	fmt.Fprintf(w, "exports:    %d\n", len(rep.Exports))
	for _, f := range rep.Exports {
		fmt.Fprintf(w, "  %s\n", f)
	}
	if rep.Usable() {
		fmt.Fprintln(w, "status:     usable")
		return
	}
	fmt.Fprintln(w, "status:     UNUSABLE")
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "  - %s\n", p)
	}
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "(none)"
	}
	return strings.Join(s, ", ")
}

func jsonReport(path string, rep *abi.Report) any {
	fns := func(fs []abi.Function) []string {
		out := make([]string, len(fs))
		for i, f := range fs {
			out[i] = f.String()
		}
		return out
	}
	return struct {
		Module         string        `json:"module"`
		Size           int           `json:"size"`
		ABI            int           `json:"abi,omitempty"`
		Manifest       *abi.Manifest `json:"manifest,omitempty"`
		ManifestSource string        `json:"manifest_source,omitempty"`
		Memory         string        `json:"memory,omitempty"`
		Imports        []string      `json:"imports"`
		Exports        []string      `json:"exports"`
		Usable         bool          `json:"usable"`
		Problems       []string      `json:"problems,omitempty"`
	}{path, rep.Size, rep.ABIVersion, rep.Manifest, rep.ManifestSource, rep.Memory, fns(rep.Imports), fns(rep.Exports), rep.Usable(), rep.Problems}
}

func cmdManifest(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "embed" {
		return usagef("manifest: the only subcommand is embed (clink-wasm manifest embed --manifest M.json IN.wasm [-o OUT.wasm])")
	}
	fs := newFlags("manifest embed", "manifest embed --manifest M.json IN.wasm [-o OUT.wasm]", stderr)
	manPath := fs.String("manifest", "", "manifest JSON file")
	out := fs.String("o", "", "output module (default: rewrite IN.wasm)")
	pos, err := parseInterspersed(fs, args[1:])
	if err != nil {
		return err
	}
	if len(pos) != 1 || *manPath == "" {
		return usagef("manifest embed: give --manifest and one module (clink-wasm manifest embed --manifest M.json IN.wasm [-o OUT.wasm])")
	}
	man, err := os.ReadFile(*manPath)
	if err != nil {
		return fmt.Errorf("reading manifest: %w", err)
	}
	bin, err := os.ReadFile(pos[0])
	if err != nil {
		return fmt.Errorf("reading module: %w", err)
	}
	nb, err := abi.EmbedManifest(bin, man)
	if err != nil {
		return err
	}
	dst := *out
	if dst == "" {
		dst = pos[0]
	}
	if err := os.WriteFile(dst, nb, 0o644); err != nil {
		return fmt.Errorf("writing module: %w", err)
	}
	return nil
}
