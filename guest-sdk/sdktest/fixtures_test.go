package sdktest

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/clinktest"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

const examplesDir = "../../examples/wasm"

// exampleModules lists the committed example fixtures, examples/wasm/NAME/NAME-LANG.wasm,
// for every SDK language, and fails if an example has a source for a language (its LANG
// directory) but no fixture.
func exampleModules(t *testing.T) (mods []struct{ name, lang, path string }) {
	t.Helper()
	for _, name := range []string{"counter", "aggregate", "dedup"} {
		for _, lang := range []string{"go", "as", "c", "cpp", "rust"} {
			path := filepath.Join(examplesDir, name, name+"-"+lang+".wasm")
			if _, err := os.Stat(filepath.Join(examplesDir, name, lang)); err != nil {
				continue
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s has a %s source but no fixture: %v (run make wasm)", name, lang, err)
				continue
			}
			mods = append(mods, struct{ name, lang, path string }{name, lang, path})
		}
	}
	return mods
}

// TestExamples runs every committed example fixture over its input.jsonl, keyed by "user" as
// the examples' READMEs do, and compares with expected.jsonl: every language must match it
// byte for byte.
func TestExamples(t *testing.T) {
	for _, ex := range exampleModules(t) {
		name, lang, path := ex.name, ex.lang, ex.path
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

// TestExamplesPipeline runs every example fixture through the production run loop
// (host/pipeline: the scheduler, the state tier, the JSON Lines sink), as `clink-wasm run
// --key user` does, and compares with expected.jsonl.
func TestExamplesPipeline(t *testing.T) {
	for _, ex := range exampleModules(t) {
		t.Run(ex.name+"-"+ex.lang, func(t *testing.T) {
			if ex.lang == "go" && testing.Short() {
				t.Skip("-short: skipping the Go module")
			}
			bin, err := os.ReadFile(ex.path)
			if err != nil {
				t.Fatal(err)
			}
			input, err := os.ReadFile(filepath.Join(examplesDir, ex.name, "input.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			sum, err := pipeline.Run(context.Background(), pipeline.Options{
				Module: bin, Input: bytes.NewReader(input), KeyField: "user", Output: &out,
				StateURL: "file://" + filepath.ToSlash(t.TempDir()),
			})
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(filepath.Join(examplesDir, ex.name, "expected.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out.Bytes(), want) {
				t.Errorf("output differs from expected.jsonl (%+v):\n%.600s", sum, out.Bytes())
			}
		})
	}
}
