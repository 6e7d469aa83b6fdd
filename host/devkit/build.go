package devkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// ErrToolchain is wrapped by Build's error when the project's compiler is not installed; the
// message names what to install.
var ErrToolchain = errors.New("toolchain missing")

// BuildResult is what Build made.
type BuildResult struct {
	Module    string      // absolute path of the built module
	Toolchain string      // the compiler command that built it
	Report    *abi.Report // what `clink-wasm inspect` says about it
}

// Build compiles the project in dir with its language's toolchain and flags (Go wasip1
// c-shared, asc with the SDK's runtime options, clang as a reactor, rustc cdylib with the
// reactor start file), checks that the manifest the module declares is the project's
// manifest.json, embeds manifest.json in the module's clink.manifest custom section, and
// inspects the result. The module is written only when all of that succeeded.
func Build(ctx context.Context, dir string) (*BuildResult, error) {
	p, err := LoadProject(dir)
	if err != nil {
		return nil, err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	manifestJSON, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, err
	}
	want, err := abi.ParseManifest(manifestJSON)
	if err != nil {
		return nil, fmt.Errorf("manifest.json: %w", err)
	}
	if want.Name != p.Name {
		return nil, fmt.Errorf("manifest.json names the operator %q, clink.json %q", want.Name, p.Name)
	}
	work := filepath.Join(dir, ".build")
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	raw := filepath.Join(work, p.Module())
	tool, err := compile(ctx, p, dir, work, raw)
	if err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(raw)
	if err != nil {
		return nil, err
	}
	eng, err := abi.NewEngine(ctx)
	if err != nil {
		return nil, err
	}
	defer eng.Close(ctx)
	// What the module itself declares (through its SDK) must be manifest.json: the state and
	// endpoint indices the code uses are positions in that list.
	if rep := eng.Inspect(ctx, bin); rep.Manifest != nil && !sameManifest(*rep.Manifest, want) {
		got, _ := json.Marshal(rep.Manifest)
		return nil, fmt.Errorf("the module declares %s, but manifest.json says %s: make them agree", got, bytes.TrimSpace(manifestJSON))
	}
	embedded, err := abi.EmbedManifest(bin, bytes.TrimSpace(manifestJSON))
	if err != nil {
		return nil, err
	}
	rep := eng.Inspect(ctx, embedded)
	out := filepath.Join(dir, p.Module())
	if err := os.WriteFile(out, embedded, 0o644); err != nil {
		return nil, err
	}
	res := &BuildResult{Module: out, Toolchain: tool, Report: rep}
	if !rep.Usable() {
		return res, fmt.Errorf("%s is not usable: %s", p.Module(), strings.Join(rep.Problems, "; "))
	}
	return res, nil
}

func sameManifest(a, b abi.Manifest) bool {
	norm := func(m abi.Manifest) abi.Manifest {
		for _, l := range []*[]string{&m.States, &m.Prefetch, &m.Endpoints} {
			if len(*l) == 0 {
				*l = nil
			}
		}
		return m
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

// compile runs the language's toolchain and returns the compiler it used.
func compile(ctx context.Context, p *Project, dir, work, out string) (string, error) {
	switch p.Lang {
	case "go":
		gobin, err := exec.LookPath("go")
		if err != nil {
			return "", fmt.Errorf("%w: go is not on PATH: install Go 1.24 or later (https://go.dev/dl/)", ErrToolchain)
		}
		cmd := exec.CommandContext(ctx, gobin, "build", "-buildmode=c-shared", "-trimpath", "-buildvcs=false",
			"-ldflags=-s -w", "-o", out, ".")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOWORK=off")
		return gobin, run(cmd, dir, "")
	case "as":
		sdk := filepath.Join(p.SDK, "assemblyscript")
		asc := filepath.Join(sdk, "node_modules", ".bin", "asc")
		if _, err := os.Stat(asc); err != nil {
			return "", fmt.Errorf("%w: the AssemblyScript compiler is not installed: run `npm ci` in %s (needs Node.js and npm)", ErrToolchain, sdk)
		}
		rt, err := filepath.Rel(dir, filepath.Join(sdk, "assembly", "runtime"))
		if err != nil {
			return "", err
		}
		rt = filepath.ToSlash(rt)
		cmd := exec.CommandContext(ctx, asc, "index.ts", "-o", out, "-O3", "--noAssert", "--runtime", "minimal",
			"--exportStart", "_initialize", "--use", "abort="+rt+"/clinkAbort", "--use", "trace="+rt+"/clinkTrace",
			"--use", "seed="+rt+"/clinkSeed")
		return asc, run(cmd, dir, "")
	case "c":
		clang, err := findTool("CLANG", "clang", "/usr/bin/clang")
		if err != nil {
			return "", fmt.Errorf("%w: clang is not installed: apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32", ErrToolchain)
		}
		cmd := exec.CommandContext(ctx, clang, "--target=wasm32-wasi", "-O2", "-Wall", "-mexec-model=reactor",
			"-Wl,--strip-debug", "-I", filepath.Join(p.SDK, "c"), "-o", out, "main.c")
		return clang, run(cmd, dir, "clang for wasm32-wasi needs Debian's clang lld wasi-libc libclang-rt-14-dev-wasm32")
	case "rust":
		rustc, target, sysroot, err := findRust()
		if err != nil {
			return "", err
		}
		crate := strings.ReplaceAll(p.Name, "-", "_")
		flags := []string{"--edition", "2021", "--target", target, "-C", "opt-level=2", "-C", "strip=debuginfo"}
		rlib := filepath.Join(work, "libclink.rlib")
		sdk := exec.CommandContext(ctx, rustc, append(flags, "--crate-type", "rlib", "--crate-name", "clink",
			"-o", rlib, filepath.Join(p.SDK, "rust", "src", "lib.rs"))...)
		if err := run(sdk, dir, ""); err != nil {
			return rustc, err
		}
		crt := filepath.Join(sysroot, "lib", "rustlib", target, "lib", "self-contained", "crt1-reactor.o")
		cmd := exec.CommandContext(ctx, rustc, append(flags, "--crate-type", "cdylib", "--crate-name", crate,
			"--extern", "clink="+rlib, "-C", "link-arg="+crt, "-C", "link-arg=-zstack-size=65536", "-o", out, "lib.rs")...)
		return rustc, run(cmd, dir, "")
	}
	return "", fmt.Errorf("unknown language %q", p.Lang)
}

// findTool returns $ENV, else name on PATH, else fallback.
func findTool(env, name, fallback string) (string, error) {
	if v := os.Getenv(env); v != "" {
		return exec.LookPath(v)
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return exec.LookPath(fallback)
}

// findRust returns a rustc that has a WASI standard library, with the target's name
// (wasm32-wasip1 in Rust 1.78 and later, wasm32-wasi before) and its sysroot: $RUSTC, rustc on
// PATH, or Debian's /usr/bin/rustc, in that order.
func findRust() (rustc, target, sysroot string, err error) {
	var tried []string
	for _, c := range []string{os.Getenv("RUSTC"), "rustc", "/usr/bin/rustc"} {
		if c == "" {
			continue
		}
		path, err := exec.LookPath(c)
		if err != nil {
			continue
		}
		outb, err := exec.Command(path, "--print", "sysroot").Output()
		if err != nil {
			continue
		}
		root := strings.TrimSpace(string(outb))
		for _, t := range []string{"wasm32-wasip1", "wasm32-wasi"} {
			if _, err := os.Stat(filepath.Join(root, "lib", "rustlib", t, "lib", "self-contained", "crt1-reactor.o")); err == nil {
				return path, t, root, nil
			}
		}
		tried = append(tried, path)
	}
	if len(tried) == 0 {
		return "", "", "", fmt.Errorf("%w: rustc is not installed: apt-get install rustc libstd-rust-dev-wasm32", ErrToolchain)
	}
	return "", "", "", fmt.Errorf("%w: %s has no WASI standard library: apt-get install libstd-rust-dev-wasm32 (Debian's rustc), or rustup target add wasm32-wasip1",
		ErrToolchain, strings.Join(tried, ", "))
}

// run runs cmd in dir and turns a failure into an error carrying its output and hint.
func run(cmd *exec.Cmd, dir, hint string) error {
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := fmt.Sprintf("%s failed: %v\n%s", filepath.Base(cmd.Path), err, bytes.TrimSpace(out))
		if hint != "" {
			msg += "\n(" + hint + ")"
		}
		return errors.New(msg)
	}
	return nil
}
