package sdktest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// TestABIDocMinimalGuest builds the WAT module of docs/abi.md's "Minimal guest" section, from
// the document itself, and runs it through the production host: the page's one complete
// example must work as printed. It needs wat2wasm (Debian's wabt, which CI installs).
func TestABIDocMinimalGuest(t *testing.T) {
	doc, err := os.ReadFile("../../docs/abi.md")
	if err != nil {
		t.Fatal(err)
	}
	wat, err := codeBlock(string(doc), "## Minimal guest", "```wat\n")
	if err != nil {
		t.Fatal(err)
	}
	wat2wasm, err := exec.LookPath("wat2wasm")
	if err != nil {
		t.Skip("wat2wasm not installed (apt-get install wabt)")
	}
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "count.wat"), filepath.Join(dir, "count.wasm")
	if err := os.WriteFile(src, []byte(wat), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(wat2wasm, src, "-o", bin).CombinedOutput(); err != nil {
		t.Fatalf("wat2wasm: %v\n%s", err, out)
	}
	in := load(t, bin)
	if in.manifest.Name != "count" || len(in.manifest.States) != 1 {
		t.Fatalf("manifest = %+v", in.manifest)
	}
	want := map[string]int{}
	for i, key := range []string{"alice", "bob", "alice", "alice", "", "bob"} {
		want[key]++
		out, err := in.process(key, `{}`, int64(i))
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if len(out) != 1 || out[0].key != key || out[0].value != fmt.Sprintf(`{"n":%d}`, want[key]) {
			t.Fatalf("record %d (key %q): emitted %+v, want one {\"n\":%d}", i, key, out, want[key])
		}
	}
	// Multi-digit counts: run one key to 123.
	var last string
	for n := want["bob"] + 1; n <= 123; n++ {
		out, err := in.process("bob", `{}`, 0)
		if err != nil || len(out) != 1 {
			t.Fatalf("count %d: %+v, %v", n, out, err)
		}
		last = out[0].value
	}
	if last != `{"n":123}` {
		t.Errorf("123rd record of bob emitted %s", last)
	}
}

// codeBlock returns the body of the first fenced block opening with fence (indentation
// included) after heading.
func codeBlock(doc, heading, fence string) (string, error) {
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		return "", fmt.Errorf("docs/abi.md has no section %q", heading)
	}
	j := strings.Index(doc[i:], "\n"+fence)
	if j < 0 {
		return "", fmt.Errorf("section %q has no %q block", heading, strings.TrimSpace(fence))
	}
	body := doc[i+j+1+len(fence):]
	indent := fence[:len(fence)-len(strings.TrimLeft(fence, " "))] // a block inside a list item
	k := strings.Index(body, "\n"+indent+"```")
	if k < 0 {
		return "", fmt.Errorf("unterminated block in section %q", heading)
	}
	return body[:k+1], nil
}

// TestABIDocCManifest compiles docs/abi.md's clang recipe for the manifest custom section,
// as printed, into a module with the two required exports, and checks that the host finds the
// manifest in the custom section. It needs Debian's clang and wasi-libc (which CI installs).
func TestABIDocCManifest(t *testing.T) {
	doc, err := os.ReadFile("../../docs/abi.md")
	if err != nil {
		t.Fatal(err)
	}
	recipe, err := codeBlock(string(doc), "## Declaring the module: the manifest", "  ```c\n")
	if err != nil {
		t.Fatal(err)
	}
	clang, err := exec.LookPath("/usr/bin/clang")
	if err != nil {
		t.Skip("clang not installed (apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32)")
	}
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "m.c"), filepath.Join(dir, "m.wasm")
	prog := recipe + `
#include <stdint.h>
static char buf[65536];
__attribute__((export_name("clink_input"))) char *clink_input(int32_t cap) { return cap > 65536 ? 0 : buf; }
__attribute__((export_name("clink_process"))) int32_t clink_process(int32_t k, int32_t v, int64_t ts) { return 0; }
`
	if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(clang, "--target=wasm32-wasi", "-O2", "-mexec-model=reactor", "-o", bin, src)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("clang: %v\n%s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	m := module(t, bin)
	rep := engine.e.Inspect(context.Background(), b)
	if rep.ManifestSource != "custom section "+abi.ManifestSection || m.Manifest.Name != "counter" || strings.Join(m.Manifest.States, ",") != "count" {
		t.Errorf("manifest from %q: %+v (problems %v)", rep.ManifestSource, m.Manifest, rep.Problems)
	}
}
