package pipeline_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clink-wasm/clink-wasm/host/connector/file"
	"github.com/clink-wasm/clink-wasm/host/connector/stdout"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// TestProcessingTimers runs the idle example, a streaming job whose operator flushes a key's
// count once the key has had no record for 5 s of processing time, in a synctest bubble: its
// clock moves only when every goroutine of the job is blocked, so the test can say exactly
// when the timers must fire without reading the wall clock. Every record is processed at the
// bubble's start; nothing may come out before 5 s, and every key's count must come out by
// then. A savepoint taken while the timers are pending keeps them, and the restored job fires
// them when their time comes (each bubble's clock starts at the same instant, so they are
// due 5 s into the second run too).
func TestProcessingTimers(t *testing.T) {
	const dir = "../../examples/wasm/idle"
	want := readLines(t, filepath.Join(dir, "expected.jsonl"))
	data, err := os.ReadFile(filepath.Join(dir, "pipeline.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	stateURL := "file://" + t.TempDir()
	run := func(restore string, wait func(start time.Time, lines func() []string, j *pipeline.Job)) []string {
		var got []string
		synctest.Test(t, func(t *testing.T) {
			start := time.Now() // the bubble's clock
			spec, err := pipeline.ParseSpec(data)
			if err != nil {
				t.Fatal(err)
			}
			var out lockedBuffer
			c := &pipeline.Connectors{}
			file.Register(c)
			stdout.Register(c, &out)
			j, err := pipeline.Start(context.Background(), spec, pipeline.Env{Connectors: c, BaseDir: dir, StateURL: stateURL, Restore: restore})
			if err != nil {
				t.Fatal(err)
			}
			lines := func() []string {
				out.mu.Lock()
				defer out.mu.Unlock()
				if out.b.Len() == 0 {
					return nil
				}
				return strings.Split(strings.TrimSuffix(out.b.String(), "\n"), "\n")
			}
			wait(start, lines, j)
			if _, err := j.Wait(); err != nil {
				t.Fatal(err)
			}
			got = lines()
		})
		return got
	}
	// First run: stop with a savepoint before the timers are due.
	got := run("", func(start time.Time, lines func() []string, j *pipeline.Job) {
		waitRecords(t, j, 50)
		// Every timer is at (the processing time of its key's last record) + 5 s, and no
		// record was processed before start.
		time.Sleep(time.Until(start.Add(4999 * time.Millisecond)))
		synctest.Wait()
		if l := lines(); len(l) != 0 {
			t.Fatalf("processing-time timers fired before they were due: %v", l)
		}
		if _, err := j.Stop(context.Background(), true); err != nil {
			t.Fatal(err)
		}
	})
	if len(got) != 0 {
		t.Fatalf("output before the timers were due: %v", got)
	}
	// Restored from the savepoint (the file source skips everything): the timers are kept,
	// and fire once their time has come; each key's count covers every record.
	got = run("latest", func(start time.Time, lines func() []string, j *pipeline.Job) {
		time.Sleep(time.Until(start.Add(4999 * time.Millisecond)))
		synctest.Wait()
		if l := lines(); len(l) != 0 {
			t.Fatalf("restored processing-time timers fired before they were due: %v", l)
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if l := lines(); !slices.Equal(sorted(l), want) {
			t.Errorf("after the idle period: %v, want %v", l, want)
		}
		if _, err := j.Stop(context.Background(), false); err != nil {
			t.Fatal(err)
		}
	})
	if !slices.Equal(sorted(got), want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// waitRecords waits (in a bubble) until the operators have completed n records.
func waitRecords(t *testing.T, j *pipeline.Job, n int64) {
	t.Helper()
	for range 1000 {
		var done int64
		for _, o := range j.Metrics().Operators {
			done += o.RecordsIn
		}
		if done >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("the operators did not complete %d records", n)
}
