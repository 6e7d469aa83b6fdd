// Command embedmanifest builds a WAT fixture: it runs wat2wasm and embeds the manifest given on
// the WAT's `;; clink.manifest: {...}` line as a custom section (wabt cannot emit custom
// sections from the text format). Usage: go run ./internal/tools/embedmanifest in.wat out.wasm
package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: embedmanifest in.wat out.wasm")
		os.Exit(2)
	}
	in, out := os.Args[1], os.Args[2]
	src, err := os.ReadFile(in)
	check(err)
	tmp := out + ".tmp"
	cmd := exec.Command("wat2wasm", "--enable-all", in, "-o", tmp)
	cmd.Stderr = os.Stderr
	check(cmd.Run())
	bin, err := os.ReadFile(tmp)
	check(err)
	os.Remove(tmp)
	const marker = ";; clink.manifest: "
	for _, line := range bytes.Split(src, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if m, ok := bytes.CutPrefix(line, []byte(marker)); ok {
			// Written raw (not re-validated) so fixtures can carry deliberately bad manifests.
			bin = abi.AppendCustomSection(bin, abi.ManifestSection, m)
		}
	}
	check(os.WriteFile(out, bin, 0o644))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "embedmanifest:", err)
		os.Exit(1)
	}
}
