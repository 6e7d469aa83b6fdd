package pipeline_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// TestStateVersionInSpecs: the spec form refuses a restore into a module that cannot read the
// checkpoint's state version before any record runs (and does not restart on it), and restores
// into one that migrates it.
func TestStateVersionInSpecs(t *testing.T) {
	dir := t.TempDir()
	bin, err := os.ReadFile(counterWasm(t))
	if err != nil {
		t.Fatal(err)
	}
	module := func(name, manifest string) string {
		b, err := abi.EmbedManifest(bin, []byte(manifest))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v1 := module("v1.wasm", `{"abi":1,"name":"counter","states":["count"],"prefetch":["count"],"state_version":1}`)
	v2 := module("v2.wasm", `{"abi":1,"name":"counter","states":["count"],"prefetch":["count"],"state_version":2}`)
	v2m := module("v2m.wasm", `{"abi":1,"name":"counter","states":["count"],"prefetch":["count"],"state_version":2,"migrates_from":[1]}`)
	in := filepath.Join(dir, "in.jsonl")
	os.WriteFile(in, []byte("{\"user\":\"a\"}\n"), 0o644)
	spec := func(mod string) string {
		return fmt.Sprintf(`
name: versions
restart: {strategy: fixed-delay, attempts: 3, delay: 1ms}
sources: [{name: in, type: file, path: %s}]
operators: [{name: count, module: %s, inputs: [in], key: user}]
sinks: [{name: out, type: file, path: %s, inputs: [count]}]
`, in, mod, filepath.Join(dir, "out.jsonl"))
	}
	env := pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")}
	if _, err := runSpec(t, spec(v1), env); err != nil {
		t.Fatal(err)
	}
	env.Restore = "latest"
	m, err := runSpec(t, spec(v2), env)
	if !errors.Is(err, pipeline.ErrStateVersion) || !strings.Contains(err.Error(), "operator count: checkpoint") ||
		!strings.Contains(err.Error(), "holds state version 1") || m.Restarts != 0 {
		t.Fatalf("v2 without migration: %v (restarts %d)", err, m.Restarts)
	}
	if _, err := runSpec(t, spec(v2m), env); err != nil {
		t.Fatalf("v2 migrating: %v", err)
	}
}
