package sdktest

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/clinktest"
)

const examplesDir = "../../examples/wasm"

// TestExamples runs every committed example fixture over its input.jsonl, keyed by "user" as
// the examples' READMEs do, and compares with expected.jsonl: both languages must match it
// byte for byte.
func TestExamples(t *testing.T) {
	for _, name := range []string{"counter", "aggregate", "dedup"} {
		for _, lang := range []string{"go", "as"} {
			path := filepath.Join(examplesDir, name, name+"-"+lang+".wasm")
			t.Run(name+"-"+lang, func(t *testing.T) {
				if lang == "go" && testing.Short() {
					t.Skip("-short: skipping the Go module")
				}
				in := load(t, path)
				input, err := os.ReadFile(filepath.Join(examplesDir, name, "input.jsonl"))
				if err != nil {
					t.Fatal(err)
				}
				var got bytes.Buffer
				sc := bufio.NewScanner(bytes.NewReader(input))
				for line := 1; sc.Scan(); line++ {
					key, err := clinktest.KeyOf(sc.Bytes(), "user")
					if err != nil {
						t.Fatalf("line %d: %v", line, err)
					}
					out, err := in.process(string(key), sc.Text(), 0)
					if err != nil {
						t.Fatalf("line %d: %v", line, err)
					}
					for _, o := range out {
						got.WriteString(o.value + "\n")
					}
				}
				if out, err := in.close(); err != nil || len(out) != 0 {
					t.Fatalf("close: %v, %v", out, err)
				}
				want, err := os.ReadFile(filepath.Join(examplesDir, name, "expected.jsonl"))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got.Bytes(), want) {
					t.Errorf("output differs from expected.jsonl:\n%s", got.Bytes())
				}
			})
		}
	}
}
