package pipeline

import (
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// logSpy is a log writer that signals when a line containing want is written.
type logSpy struct {
	mu   sync.Mutex
	buf  strings.Builder
	want string
	seen chan struct{}
	once sync.Once
}

func (l *logSpy) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if strings.Contains(l.buf.String(), l.want) {
		l.once.Do(func() { close(l.seen) })
	}
	return len(p), nil
}

func (l *logSpy) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestFlagFormLogsStateFailures: a compaction that fails in the background (its segments
// deleted under it) is logged on the run's log (stderr for clink-wasm run), through
// state.WithLogger. After the second checkpoint the segments are deleted; the third commit's
// compaction (3 segments over max_segments=2) cannot read them, and its commit hook waits for
// the warning, the store still open.
func TestFlagFormLogsStateFailures(t *testing.T) {
	dir := t.TempDir()
	pool, err := StateURLForDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	spy := &logSpy{want: "state: compaction failed", seen: make(chan struct{})}
	var in strings.Builder
	for i := range 200000 {
		fmt.Fprintf(&in, "{\"u\":\"k%d\"}\n", i%50)
	}
	opts := Options{Module: abiFixture(t, "counter"), KeyField: "u", StateURL: pool + "?max_segments=2", CheckpointEvery: time.Millisecond, Log: spy}
	commits := 0
	opts.OnCommitPhase = deleteSegmentsThenWait(dir, spy, &commits)
	out, sum, err := runOpts(t, opts, in.String())
	if commits < 3 {
		t.Skipf("the run took %d checkpoints, not the 3 the test needs (%v, %d bytes out)", commits, err, len(out))
	}
	if log := spy.String(); !strings.Contains(log, "level=WARN msg=\"state: compaction failed") || !strings.Contains(log, "operator=counter.operator") {
		t.Fatalf("run: %v (%d records in); log:\n%s", err, sum.RecordsIn, log)
	}
}

// deleteSegmentsThenWait is a commit hook: after the second checkpoint it deletes the pool's
// segments; at the third, whose compaction (3 segments over max_segments=2) cannot read them,
// it waits for the warning (30 s at most), the store still open.
func deleteSegmentsThenWait(dir string, spy *logSpy, commits *int) func(CommitPhase, uint64) error {
	return func(ph CommitPhase, _ uint64) error {
		if ph != PhaseRecordWritten {
			return nil
		}
		switch *commits++; *commits {
		case 2:
			// The keys' state is in the hot tier: the run itself does not need them.
			filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
				if err == nil && strings.HasSuffix(p, ".seg") {
					os.Remove(p)
				}
				return nil
			})
		case 3:
			select {
			case <-spy.seen:
			case <-time.After(30 * time.Second):
			}
		}
		return nil
	}
}

// TestJobLogsStateFailures: the same through Start (run --pipeline, the server): the store the
// runtime opens logs to Env.Log, naming the job.
func TestJobLogsStateFailures(t *testing.T) {
	dir := t.TempDir()
	pool, err := StateURLForDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	mod, err := filepath.Abs("../abi/testdata/counter.wasm")
	if err != nil {
		t.Fatal(err)
	}
	spy := &logSpy{want: "state: compaction failed", seen: make(chan struct{})}
	var recs []SourceRecord
	for i := range 200000 {
		recs = append(recs, SourceRecord{Key: []byte(fmt.Sprintf("k%d", i%50)), Value: []byte("{}"), Pos: int64(i)})
	}
	conns := &Connectors{}
	conns.RegisterSource("mem", func(*SourceSpec, *ConnectorOptions, *Env) (Source, error) { return &memSource{recs: recs}, nil })
	conns.RegisterSink("out", func(*SinkSpec, *ConnectorOptions, *Env) (Sink, error) { return &memSink{}, nil })
	spec, err := ParseSpec([]byte(fmt.Sprintf(`
name: logged
checkpoints: {interval: 1ms}
sources: [{name: in, type: mem}]
operators: [{name: count, module: %s, inputs: [in], key: {source: true}}]
sinks: [{name: out, type: out, inputs: [count]}]
`, mod)))
	if err != nil {
		t.Fatal(err)
	}
	commits := 0
	j, err := Start(t.Context(), spec, Env{Connectors: conns, StateURL: pool + "?max_segments=2",
		Log: slog.New(slog.NewTextHandler(spy, nil)), OnCommitPhase: deleteSegmentsThenWait(dir, spy, &commits)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = j.Wait()
	if commits < 3 {
		t.Skipf("the job took %d checkpoints, not the 3 the test needs (%v)", commits, err)
	}
	if log := spy.String(); !strings.Contains(log, "level=WARN msg=\"state: compaction failed") || !strings.Contains(log, "job=logged") {
		t.Fatalf("job: %v; log:\n%s", err, log)
	}
}
