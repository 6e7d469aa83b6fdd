package pipeline_test

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// twoSplits is a streaming source of two splits: "busy" emits a record every millisecond with
// event time advancing a second per record; "idle" emits one record and then nothing.
type twoSplits struct{}

func (twoSplits) Splits(context.Context) ([]string, error) { return []string{"busy", "idle"}, nil }
func (twoSplits) Bounded() bool                            { return false }
func (twoSplits) Open(_ context.Context, s []pipeline.Split) (pipeline.SourceReader, error) {
	return &twoReader{n: len(s)}, nil
}

type twoReader struct {
	n        int
	busy     int64
	idleSent bool
	buf      []byte
}

func (r *twoReader) Read(ctx context.Context, buf []pipeline.SourceRecord) (int, error) {
	if r.n != 2 {
		return 0, io.EOF
	}
	time.Sleep(time.Millisecond)
	if !r.idleSent {
		r.idleSent = true
		buf[0] = pipeline.SourceRecord{Split: 1, Value: []byte(`{"user":"idle","ts":0}`)}
		return 1, nil
	}
	r.busy++
	r.buf = strconv.AppendInt(append(r.buf[:0], `{"user":"busy","ts":`...), r.busy*1000, 10)
	r.buf = append(r.buf, '}')
	buf[0] = pipeline.SourceRecord{Split: 0, Value: r.buf, Pos: r.busy}
	return 1, nil
}

func (r *twoReader) Positions() []pipeline.Split {
	return []pipeline.Split{{ID: "busy", Position: []byte(strconv.FormatInt(r.busy, 10))}, {ID: "idle"}}
}
func (r *twoReader) Close() error { return nil }

// TestIdleSplit: a split with no record for idle_timeout stops holding the watermark back, so
// event-time windows of the busy split fire while the job runs.
func TestIdleSplit(t *testing.T) {
	c := connectors()
	c.RegisterSource("two", func(*pipeline.SourceSpec, *pipeline.ConnectorOptions, *pipeline.Env) (pipeline.Source, error) {
		return twoSplits{}, nil
	})
	dir := t.TempDir()
	spec := fmt.Sprintf(`
name: idle
sources: [{name: s, type: two, event_time: {field: ts, idle_timeout: 30ms, watermark_every: 1}}]
operators: [{name: w, module: %s, inputs: [s], key: user}]
sinks: [{name: out, type: file, path: %s, inputs: [w]}]
`, must(filepath.Abs("../../examples/wasm/tumbling/tumbling-as.wasm")), filepath.Join(dir, "out.jsonl"))
	j := start(t, spec, pipeline.Env{Connectors: c, StateURL: "file://" + filepath.Join(dir, "state")})
	// The idle split's record (ts 0) keeps its split's watermark at 0 until the split goes
	// idle; then the busy split's one-minute windows close as its event time advances.
	waitOutput(t, j, 2)
	if _, err := j.Stop(context.Background(), false); err != nil {
		t.Fatal(err)
	}
}
