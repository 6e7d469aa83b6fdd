package pipeline

import (
	"errors"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/state"
)

// TestStateVersions: a checkpoint records the module's state_version; a module of another
// version restores it only if it lists that version in migrates_from, and the refusal says
// what to do.
func TestStateVersions(t *testing.T) {
	counter := abiFixture(t, "counter")
	v1 := withManifest(t, counter, `{"abi":1,"name":"counter","states":["count"],"state_version":1}`)
	v2 := withManifest(t, counter, `{"abi":1,"name":"counter","states":["count"],"state_version":2}`)
	v2m := withManifest(t, counter, `{"abi":1,"name":"counter","states":["count"],"state_version":2,"migrates_from":[0,1]}`)
	pool := newMemPool(t)
	run := func(mod []byte, batch string) (string, *Summary, error) {
		return runOpts(t, Options{Module: mod, KeyField: "u", StateURL: pool, Restore: RestoreLatestIfAny, InputName: batch}, "{\"u\":\"a\"}\n")
	}
	if out, _, err := run(v1, "b1"); err != nil || out != "{\"count\":1}\n" {
		t.Fatalf("v1: %v %q", err, out)
	}
	_, _, err := run(v2, "b2")
	if !errors.Is(err, ErrStateVersion) || !strings.Contains(err.Error(), "holds state version 1") ||
		!strings.Contains(err.Error(), "declares state_version 2") || !strings.Contains(err.Error(), `"migrates_from": [1]`) {
		t.Fatalf("v2 without migration: %v", err)
	}
	out, sum, err := run(v2m, "b3")
	if err != nil || out != "{\"count\":2}\n" || !sum.Restored.Migrated || !strings.Contains(sum.Restored.String(), "state version 1 migrated to 2 by the module") {
		t.Fatalf("v2 migrating: %v %q %+v", err, out, sum.Restored)
	}
	// Its checkpoint is version 2 now: v1 cannot go back to it.
	if _, _, err := run(v1, "b4"); !errors.Is(err, ErrStateVersion) || !strings.Contains(err.Error(), "holds state version 2") {
		t.Fatalf("back to v1: %v", err)
	}
	// An unversioned module's checkpoint is version 0.
	pool2 := newMemPool(t)
	if _, _, err := runOpts(t, Options{Module: counter, KeyField: "u", StateURL: pool2}, "{\"u\":\"a\"}\n"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runOpts(t, Options{Module: v1, KeyField: "u", StateURL: pool2, Restore: state.RestoreLatest, InputName: "x"}, "{\"u\":\"a\"}\n"); !errors.Is(err, ErrStateVersion) || !strings.Contains(err.Error(), "holds state version 0") {
		t.Fatalf("unversioned to v1: %v", err)
	}
	if out, _, err := runOpts(t, Options{Module: v2m, KeyField: "u", StateURL: pool2, Restore: state.RestoreLatest, InputName: "y"}, "{\"u\":\"a\"}\n"); err != nil || out != "{\"count\":2}\n" {
		t.Fatalf("unversioned to v2 (migrates from 0): %v %q", err, out)
	}
}
