package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// txlog is a deciding sink in the manner of a transactional Kafka sink: writers buffer their
// records (an open transaction), and Decide appends the checkpoint's records together with a
// marker naming the checkpoint to a log in one atomic write (the transaction commit). What an
// aborted attempt buffered is simply lost, as an aborted transaction is.
type txlog struct {
	path string
}

type txEntry struct {
	Checkpoint uint64   `json:"checkpoint"`
	Record     string   `json:"record"`
	Lines      []string `json:"lines"`
}

func (s *txlog) Committer() pipeline.SinkCommitter { return s }

func (s *txlog) Open(ctx context.Context, sc pipeline.SinkContext) (pipeline.SinkWriter, error) {
	return &txWriter{s: s}, nil
}

type txWriter struct {
	s   *txlog
	buf []string
}

func (w *txWriter) Write(ctx context.Context, recs []pipeline.SinkRecord) error {
	for _, r := range recs {
		w.buf = append(w.buf, string(r.Value))
	}
	return nil
}

func (w *txWriter) PreCommit(ctx context.Context, id uint64) ([]byte, error) {
	b, err := json.Marshal(w.buf)
	w.buf = nil
	return b, err
}

func (w *txWriter) Close(ctx context.Context) error { return nil }

func (s *txlog) Prepare(ctx context.Context, id uint64, handles [][]byte) ([]byte, error) {
	var all []string
	for _, h := range handles {
		var l []string
		if err := json.Unmarshal(h, &l); err != nil {
			return nil, err
		}
		all = append(all, l...)
	}
	return json.Marshal(all)
}

func (s *txlog) entries() ([]txEntry, error) {
	b, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var out []txEntry
	for l := range strings.Lines(string(b)) {
		var e txEntry
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, err
}

func (s *txlog) Decide(ctx context.Context, id uint64, record string, prep []byte) error {
	var lines []string
	if err := json.Unmarshal(prep, &lines); err != nil {
		return err
	}
	b, _ := json.Marshal(txEntry{Checkpoint: id, Record: record, Lines: lines})
	f, err := os.OpenFile(s.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Write(append(b, '\n'))
	return err
}

func (s *txlog) Decided(ctx context.Context) (uint64, error) {
	es, err := s.entries()
	if err != nil || len(es) == 0 {
		return 0, err
	}
	return es[len(es)-1].Checkpoint, nil
}

func (s *txlog) Commit(ctx context.Context, id uint64, prep []byte) error { return nil }

func (s *txlog) Recover(ctx context.Context, id uint64, prep []byte) error { return nil }

// TestDecidingSinkRollForward: a crash after the deciding sink committed checkpoint n but
// before the record of n was committed rolls n forward on restore: its output is neither lost
// nor repeated.
func TestDecidingSinkRollForward(t *testing.T) {
	dir := t.TempDir()
	ref := filepath.Join(dir, "ref.jsonl")
	if _, err := runSpec(t, genSpec("ref", ref, 1, 3000, 0), pipeline.Env{StateURL: "file://" + filepath.Join(dir, "refstate")}); err != nil {
		t.Fatal(err)
	}
	sink := &txlog{path: filepath.Join(dir, "tx.log")}
	c := connectors()
	c.RegisterSink("txlog", func(*pipeline.SinkSpec, *pipeline.ConnectorOptions, *pipeline.Env) (pipeline.Sink, error) {
		return sink, nil
	})
	spec := strings.Replace(genSpec("tx", "unused", 2, 3000, 6000), "type: file, path: unused", "type: txlog", 1)
	env := pipeline.Env{Connectors: c, StateURL: "file://" + filepath.Join(dir, "state")}
	// Crash at the first decided checkpoint: a periodic one, or under heavy load the final one
	// (a bounded job always ends with a decided checkpoint). Counting on a third periodic
	// checkpoint before the input ran out failed under load.
	seen := 0
	var decided uint64
	env.OnCommitPhase = func(p pipeline.CommitPhase, id uint64) error {
		if p == pipeline.PhaseDecided {
			if seen++; seen == 1 {
				decided = id
				return errors.New("crash between the decision and the record")
			}
		}
		return nil
	}
	if _, err := runSpec(t, spec, env); err == nil || !strings.Contains(err.Error(), "crash between") {
		t.Fatalf("want the injected failure, got %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "jobs", "_", "tx", "prepared", fmt.Sprintf("%020d.json", decided))); err != nil {
		t.Fatalf("no prepared record: %v", err)
	}
	env.OnCommitPhase = nil
	env.Restore = "latest"
	m, err := runSpec(t, spec, env)
	if err != nil {
		t.Fatal(err)
	}
	if m.Restored != decided {
		t.Fatalf("restored %d, want the decided %d rolled forward", m.Restored, decided)
	}
	es, err := sink.entries()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Lines...)
	}
	comparePerKey(t, got, readLines(t, ref))

	// A stale prepared record, older than the newest committed one (a zombie's, or one a later
	// checkpoint superseded), is deleted on restore, never committed: the deciding sink reports
	// a newer checkpoint decided, so "decided" alone would let it through.
	jobDir := filepath.Join(dir, "state", "jobs", "_", "tx")
	stale := decided + 1 // attempt 1 crashed at decided: nothing after it was committed
	ids, _ := os.ReadDir(filepath.Join(jobDir, "checkpoints"))
	if len(ids) == 0 {
		t.Fatal("no committed records")
	}
	b, err := os.ReadFile(filepath.Join(jobDir, "checkpoints", ids[0].Name()))
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	rec["id"] = stale
	if b, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(jobDir, "prepared", fmt.Sprintf("%020d.json", stale)), b, 0o644); err != nil {
		t.Fatal(err)
	}
	// Keep every record, so that retention cannot hide a false one.
	keepAll := strings.Replace(spec, "checkpoints: {interval: 50ms}", "checkpoints: {interval: 50ms, retain: 1000}", 1)
	if keepAll == spec {
		t.Fatal("the spec's checkpoints line changed: update this test")
	}
	if _, err := runSpec(t, keepAll, env); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(jobDir, "checkpoints", fmt.Sprintf("%020d.json", stale))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the stale prepared record %d was committed (stat: %v)", stale, err)
	}
	if _, err := os.Stat(filepath.Join(jobDir, "prepared", fmt.Sprintf("%020d.json", stale))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the stale prepared record %d is still there (stat: %v)", stale, err)
	}
}
