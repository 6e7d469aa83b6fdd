package replay_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/clink-wasm/clink-wasm/host/replay"
	"github.com/clink-wasm/clink-wasm/host/state"
)

const secret = "s3cr3t-token-xyz-42"

// upstream is a loopback enrichment service that echoes what it got, including the injected
// Authorization header: a recorder that wrote what the guest saw verbatim would leak it.
func upstream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var authed atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		auth := r.Header.Get("Authorization")
		if auth == "Bearer "+secret {
			authed.Add(1)
		}
		a, _ := json.Marshal(auth)
		fmt.Fprintf(w, `{"n":%q,"v":%s,"auth":%s}`, r.URL.Query().Get("n"), body, a)
	}))
	t.Cleanup(srv.Close)
	return srv, &authed
}

func endpoints(t *testing.T, url string) []lookup.EndpointConfig {
	t.Setenv("CLINK_REPLAY_TEST_TOKEN", secret)
	return []lookup.EndpointConfig{{Name: "svc", BaseURL: url, Methods: []string{"POST"},
		Headers: map[string]string{"Authorization": "Bearer ${env:CLINK_REPLAY_TEST_TOKEN}"},
		Egress:  lookup.EgressPolicy{AllowLoopback: true}}}
}

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// input makes n records over keys u0..u(k-1).
func input(n, k int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"user":"u%d","i":%d}`+"\n", i%k, i)
	}
	return b.String()
}

type runOpts struct {
	dir      string // record here ("" no recording)
	maxBytes int64
	stateURL string
	hot      int64
	restore  uint64
	// inputName names the input in checkpoints: a restore skips what the checkpoint covers of
	// an input of the same name (default "input").
	inputName string
}

func runPipeline(t *testing.T, mod []byte, in string, eps []lookup.EndpointConfig, o runOpts) (string, error) {
	t.Helper()
	var out bytes.Buffer
	opts := pipeline.Options{Module: mod, Input: strings.NewReader(in), Output: &out, KeyField: "user",
		Endpoints: eps, StateURL: o.stateURL, HotBytes: o.hot, Restore: o.restore, CheckpointEvery: -1, InputName: o.inputName}
	var rec *replay.Recorder
	if o.dir != "" {
		var err error
		if rec, err = replay.Create(o.dir, replay.RecorderOptions{MaxBytes: o.maxBytes}); err != nil {
			t.Fatal(err)
		}
		opts.Record = rec
	}
	_, err := pipeline.Run(context.Background(), opts)
	if rec != nil {
		if cerr := rec.Close(err); err == nil {
			err = cerr
		}
	}
	return out.String(), err
}

// noSecret fails if any file of dir holds the secret, as is or base64-encoded.
func noSecret(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{secret, base64.StdEncoding.EncodeToString([]byte(secret))[:16]} {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds the injected secret (%q)", e.Name(), s)
			}
		}
	}
}

func replayWith(t *testing.T, dir string, mod []byte) *replay.Report {
	t.Helper()
	rep, err := replay.Run(context.Background(), dir, replay.Options{Module: mod})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestReplayEnrichmentIdentical(t *testing.T) {
	srv, authed := upstream(t)
	dir := filepath.Join(t.TempDir(), "rec")
	mod := fixture(t, "stateenrich.wasm")
	out, err := runPipeline(t, mod, input(40, 5), endpoints(t, srv.URL), runOpts{dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if authed.Load() != 40 {
		t.Fatalf("the upstream saw the injected secret %d times, want 40", authed.Load())
	}
	if !strings.Contains(out, `"auth":"Bearer `+secret) {
		t.Fatalf("the guest did not see the echoed secret, so the test proves nothing: %.200s", out)
	}
	noSecret(t, dir)
	man, err := replay.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if man.Status != replay.StatusComplete || man.Counts.Records != 40 || man.Counts.Lookups != 40 || man.Counts.Outputs != 40 || man.Redacted == 0 {
		t.Fatalf("manifest: %+v", man)
	}
	srv.Close() // no network from here on
	rep := replayWith(t, dir, mod)
	if !rep.Identical() || rep.GotOutputs != 40 || rep.ExpectedOutputs != 40 || rep.Records != 40 {
		t.Fatalf("replay with the same module is not identical: %+v", rep)
	}
}

func TestReplayChangedModule(t *testing.T) {
	srv, _ := upstream(t)
	dir := filepath.Join(t.TempDir(), "rec")
	if _, err := runPipeline(t, fixture(t, "stateenrich.wasm"), input(20, 4), endpoints(t, srv.URL), runOpts{dir: dir}); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	rep := replayWith(t, dir, fixture(t, "stateenrich2.wasm"))
	// Each of the 4 keys has 5 records; stateenrich2 drops the outputs of the 3rd to the 5th.
	if rep.Identical() || rep.Differing != 12 || rep.GotOutputs != 8 || rep.Unrecorded != 0 {
		t.Fatalf("report: differing %d, got %d, unrecorded %d, want 12, 8, 0", rep.Differing, rep.GotOutputs, rep.Unrecorded)
	}
	d := rep.Diffs[0]
	// Input line 9 is the third record of u0 (lines 1, 5, 9).
	if d.Source.Pos != 9 || string(d.Source.Key) != "u0" || len(d.Expected) != 1 || len(d.Got) != 0 ||
		!strings.Contains(string(d.Expected[0].Value), `"n":"2"`) {
		t.Fatalf("first diff: %+v", d)
	}
	for i := 1; i < len(rep.Diffs); i++ {
		if rep.Diffs[i-1].Source.Pos >= rep.Diffs[i].Source.Pos {
			t.Fatalf("diffs out of input order: %d then %d", rep.Diffs[i-1].Source.Pos, rep.Diffs[i].Source.Pos)
		}
	}
}

// A run whose reads go cold (a restored checkpoint, a tiny hot tier) and that makes lookups
// replays with neither the state pool nor the upstream.
func TestReplayColdStateWithoutStateOrNetwork(t *testing.T) {
	srv, _ := upstream(t)
	eps := endpoints(t, srv.URL)
	stateDir := t.TempDir()
	stateURL, err := pipeline.StateURLForDir(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	mod := fixture(t, "stateenrich.wasm")
	if _, err := runPipeline(t, mod, input(30, 10), eps, runOpts{stateURL: stateURL, hot: 1}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "rec")
	out, err := runPipeline(t, mod, input(30, 10), eps, runOpts{dir: dir, stateURL: stateURL, hot: 1, restore: state.RestoreLatest, inputName: "second-batch"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"n":"3"`) {
		t.Fatalf("the restored counts were not read: %.300s", out)
	}
	var coldFound int
	if err := replay.ReadFile(dir, replay.StateFile, func(_ int64, op *replay.StateOp) error {
		if op.Op == replay.OpGet && op.Tier == "cold" && op.Found {
			coldFound++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if coldFound != 10 {
		t.Fatalf("%d cold reads with a value recorded, want one per key (10)", coldFound)
	}
	man, _ := replay.ReadManifest(dir)
	if !strings.HasPrefix(man.StateOrigin, "checkpoint ") {
		t.Fatalf("state origin %q", man.StateOrigin)
	}
	srv.Close()
	if err := os.RemoveAll(stateDir); err != nil {
		t.Fatal(err)
	}
	rep := replayWith(t, dir, mod)
	if !rep.Identical() || rep.GotOutputs != 30 {
		t.Fatalf("replay: %+v", rep)
	}
	// A module that reads a key the recording never saw is told so, not sent anywhere.
	cut := filepath.Join(t.TempDir(), "cut")
	copyDir(t, dir, cut)
	dropped := dropFirstStateLine(t, cut)
	rep = replayWith(t, cut, mod)
	// The first read of a key is gone: it is reported, the key's count starts at 0, so its three
	// requests (n=0, 1, 2 instead of 3, 4, 5) are not in the recording either, and its three
	// records differ.
	if rep.Identical() || rep.Unrecorded != 4 || len(rep.UnrecordedReads) != 1 || rep.UnrecordedReads[0].State != "count" ||
		string(rep.UnrecordedReads[0].Key) != dropped || len(rep.UnrecordedLookups) != 3 || rep.Differing != 3 {
		t.Fatalf("an unrecorded read was not reported: %+v", rep)
	}
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(to, 0o700); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(from)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// dropFirstStateLine drops the first get of state.jsonl and returns its record key (the cold
// reads of a restored run complete concurrently, so which key comes first varies).
func dropFirstStateLine(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, replay.StateFile)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	key := ""
	for i, l := range lines {
		if strings.Contains(l, `"op":"get"`) {
			var op replay.StateOp
			if err := json.Unmarshal([]byte(l), &op); err != nil {
				t.Fatal(err)
			}
			key = string(op.Key)
			lines = append(lines[:i], lines[i+1:]...)
			break
		}
	}
	if err := os.WriteFile(p, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	return key
}

func TestRecordSizeCap(t *testing.T) {
	srv, _ := upstream(t)
	dir := filepath.Join(t.TempDir(), "rec")
	_, err := runPipeline(t, fixture(t, "stateenrich.wasm"), input(500, 5), endpoints(t, srv.URL), runOpts{dir: dir, maxBytes: 4 << 10})
	if !errors.Is(err, replay.ErrSizeCap) || !strings.Contains(err.Error(), "--record-max-bytes") {
		t.Fatalf("err = %v, want the size cap", err)
	}
	man, err := replay.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if man.Status != replay.StatusTruncated || man.Bytes > 4<<10 {
		t.Fatalf("manifest status %s, %d bytes", man.Status, man.Bytes)
	}
	var size int64
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".jsonl") {
			fi, _ := e.Info()
			size += fi.Size()
		}
	}
	if size > 4<<10 {
		t.Fatalf("the recording holds %d bytes, over its 4 KiB cap", size)
	}
	if _, err := replay.Run(context.Background(), dir, replay.Options{Module: fixture(t, "stateenrich.wasm")}); !errors.Is(err, replay.ErrNotReplayable) {
		t.Fatalf("replaying a truncated recording: %v", err)
	}
}

func TestRecordRefusesExistingRecording(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := replay.Create(dir, replay.RecorderOptions{}); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("err = %v", err)
	}
}

// The examples' counter, built with the AssemblyScript and the Go SDK (prefetched state, the
// output area): either build reproduces the other's recording, and dedup does not.
func TestReplayExamplesAcrossBuilds(t *testing.T) {
	ex := "../../examples/wasm/"
	in, err := os.ReadFile(ex + "counter/input.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	read := func(p string) []byte {
		b, err := os.ReadFile(ex + p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	dir := filepath.Join(t.TempDir(), "rec")
	if _, err := runPipeline(t, read("counter/counter-as.wasm"), string(in), nil, runOpts{dir: dir}); err != nil {
		t.Fatal(err)
	}
	if rep := replayWith(t, dir, read("counter/counter-go.wasm")); !rep.Identical() || rep.GotOutputs == 0 {
		t.Fatalf("counter-go against counter-as's recording: %+v", rep)
	}
	rep := replayWith(t, dir, read("dedup/dedup-as.wasm"))
	if rep.Identical() || rep.Differing != rep.Records || rep.Unrecorded != 0 {
		t.Fatalf("dedup against counter's recording: differing %d of %d records, unrecorded %d", rep.Differing, rep.Records, rep.Unrecorded)
	}
}
