package pipeline_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// waitEnd waits for j to end; the bound only ends a hung test.
func waitEnd(t *testing.T, j *pipeline.Job) (pipeline.JobMetrics, error) {
	t.Helper()
	select {
	case <-j.Done():
	case <-time.After(2 * time.Minute):
		t.Fatal("the job did not end")
	}
	return j.Wait()
}

// TestSetLimitsCallTime: a call time limit lowered while the job runs stops a runaway guest
// that the limit it started with (an hour) would have let run.
func TestSetLimitsCallTime(t *testing.T) {
	dir := t.TempDir()
	spec := fmt.Sprintf(`
name: spin
restart: {strategy: none}
sources: [{name: in, type: file, path: %s}]
operators: [{name: spin, module: %s, inputs: [in], key: user, limits: {call_timeout: 1h}}]
sinks: [{name: out, type: file, path: %s, inputs: [spin]}]
`, must(filepath.Abs("../../examples/wasm/counter/input.jsonl")), must(filepath.Abs("../abi/testdata/loop.wasm")), filepath.Join(dir, "out.jsonl"))
	j := start(t, spec, pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")})
	if err := j.SetLimits(map[string]pipeline.LimitsSpec{"nope": {MaxInFlight: 1}}); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("an unknown operator: %v", err)
	}
	if err := j.SetLimits(map[string]pipeline.LimitsSpec{"spin": {CallTimeout: pipeline.Duration(50 * time.Millisecond), MaxInFlight: 2}}); err != nil {
		t.Fatal(err)
	}
	m, err := waitEnd(t, j)
	if err == nil || !strings.Contains(err.Error(), "50ms") || m.State != pipeline.JobFailed {
		t.Fatalf("want a failure naming the live limit of 50ms, got %v (%s)", err, m.State)
	}
}

// refuseGate refuses every lookup, counting them.
type refuseGate struct{ n atomic.Int64 }

func (g *refuseGate) Admit(_ context.Context, admitted func(error)) {
	g.n.Add(1)
	go admitted(fmt.Errorf("%w: the tenant's lookup quota is 0", abi.LookupRefused)) // later, from another goroutine
}

// TestLookupGate: Env.LookupGate sees every lookup before it is sent, and the code of its
// refusal is what the guest gets.
func TestLookupGate(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	spec := fmt.Sprintf(`
name: enrich
sources: [{name: in, type: file, path: %s}]
operators: [{name: e, module: %s, inputs: [in], key: user, endpoints: [{name: svc, base_url: "http://127.0.0.1:9", egress: {allow_loopback: true}}]}]
sinks: [{name: out, type: file, path: %s, inputs: [e]}]
`, must(filepath.Abs("../../examples/wasm/counter/input.jsonl")), must(filepath.Abs("../abi/testdata/enrich.wasm")), out)
	g := &refuseGate{}
	m, err := runSpec(t, spec, pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state"), LookupGate: g})
	if err != nil {
		t.Fatal(err)
	}
	lines := readLines(t, out)
	if int64(len(lines)) != g.n.Load() || len(lines) == 0 {
		t.Fatalf("%d outputs, %d lookups through the gate (%s)", len(lines), g.n.Load(), m.State)
	}
	for _, l := range lines {
		if !strings.Contains(l, `"lookup_error":19`) {
			t.Fatalf("output %q: want LOOKUP_REFUSED (19) from the gate", l)
		}
	}
}
