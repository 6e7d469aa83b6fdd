package devkit

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/clink-wasm/clink-wasm/host/replay"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// TestFromRecordingRestored: a run restored from a checkpoint is recorded, turned into a test
// table (through its JSON form, as `replay --cases` writes it) whose cases carry the state the
// run was served; the table passes with the recorded module, and a module that does not declare
// the recorded state is refused by name.
func TestFromRecordingRestored(t *testing.T) {
	read := func(p string) []byte {
		b, err := os.ReadFile("../../examples/wasm/" + p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	counter, dedup := read("counter/counter-go.wasm"), read("dedup/dedup-as.wasm")
	in := read("counter/input.jsonl")
	stateURL := "file://" + t.TempDir()
	run := func(rec *replay.Recorder, restore uint64, batch string) {
		t.Helper()
		opts := pipeline.Options{Module: counter, Input: bytes.NewReader(in), Output: io.Discard, KeyField: "user",
			StateURL: stateURL, Restore: restore, CheckpointEvery: -1, Record: rec, InputName: batch}
		_, err := pipeline.Run(context.Background(), opts)
		if rec != nil {
			if cerr := rec.Close(err); err == nil {
				err = cerr
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	run(nil, 0, "first")
	dir := filepath.Join(t.TempDir(), "rec")
	rec, err := replay.Create(dir, replay.RecorderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	run(rec, state.RestoreLatest, "second") // a new batch: read from its start on the restored state

	tab, err := FromRecording(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(tab)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tests.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	withState := 0
	for _, c := range tab.Cases {
		if len(c.State) > 0 {
			withState++
		}
	}
	if len(tab.Cases) < 2 || withState != len(tab.Cases) {
		t.Fatalf("%d cases, %d with initial state; want every case to start from the restored count", len(tab.Cases), withState)
	}
	var out bytes.Buffer
	if _, err := TestFiles(context.Background(), "../../examples/wasm/counter/counter-go.wasm", path, "", &out); err != nil {
		t.Fatalf("recorded module: %v\n%s", err, out.String())
	}
	tmp := filepath.Join(t.TempDir(), "dedup.wasm")
	if err := os.WriteFile(tmp, dedup, 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if _, err := TestFiles(context.Background(), tmp, path, "", &out); err == nil || !strings.Contains(err.Error(), `initial state names "count", which the module does not declare`) {
		t.Fatalf("another module: %v\n%s", err, out.String())
	}
}
