package pipeline_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// TestUnkeyedParallel: an unkeyed operator (order none or input) at parallelism > 1 gets its
// records round robin: every subtask an equal share, whatever the records' keys (here none:
// a hash of the key would send them all to one subtask).
func TestUnkeyedParallel(t *testing.T) {
	noop, err := filepath.Abs("../abi/testdata/noop.wasm")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		order          string
		srcPar, opPar  int
		records        int
		minShare, most int64
	}{
		{"none", 1, 3, 3000, 1000, 1000},
		{"input", 1, 2, 3001, 1500, 1501},
		{"none", 2, 3, 3000, 990, 1010}, // two source subtasks, each round robin from its own offset
	} {
		t.Run(fmt.Sprintf("%s-%d-%d", tc.order, tc.srcPar, tc.opPar), func(t *testing.T) {
			dir := t.TempDir()
			for s := range tc.srcPar {
				var in strings.Builder
				for i := range tc.records / tc.srcPar {
					fmt.Fprintf(&in, "{\"n\":%d}\n", i)
				}
				if s == 0 {
					for range tc.records % tc.srcPar {
						in.WriteString("{\"n\":-1}\n")
					}
				}
				p := filepath.Join(dir, fmt.Sprintf("in%d.jsonl", s))
				if err := os.WriteFile(p, []byte(in.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			m, err := runSpec(t, fmt.Sprintf(`
name: unkeyed
sources: [{name: in, type: file, path: %s, parallelism: %d}]
operators: [{name: op, module: %s, inputs: [in], order: %s, parallelism: %d}]
sinks: [{name: out, type: file, path: %s, inputs: [op]}]
`, filepath.Join(dir, "in*.jsonl"), tc.srcPar, noop, tc.order, tc.opPar, filepath.Join(dir, "out.jsonl")), pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")})
			if err != nil {
				t.Fatal(err)
			}
			var total int64
			shares := map[int]int64{}
			for _, o := range m.Operators {
				shares[o.Subtask] = o.RecordsIn
				total += o.RecordsIn
			}
			if total != int64(tc.records) || len(shares) != tc.opPar {
				t.Fatalf("%d records over %v, want %d over %d subtasks", total, shares, tc.records, tc.opPar)
			}
			for s, n := range shares {
				if n < tc.minShare || n > tc.most {
					t.Fatalf("subtask %d got %d records (shares %v), want %d to %d", s, n, shares, tc.minShare, tc.most)
				}
			}
		})
	}
}

// TestUnkeyedRefusesKeyedState: a module with keyed state cannot run unkeyed: its records
// would be spread over subtasks and run concurrently.
func TestUnkeyedRefusesKeyedState(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	os.WriteFile(in, []byte("{\"user\":\"a\"}\n"), 0o644)
	_, err := runSpec(t, fmt.Sprintf(`
name: unkeyed
sources: [{name: in, type: file, path: %s}]
operators: [{name: op, module: %s, inputs: [in], order: none, parallelism: 2}]
sinks: [{name: out, type: file, path: %s, inputs: [op]}]
`, in, counterWasm(t), filepath.Join(dir, "out.jsonl")), pipeline.Env{StateURL: "file://" + filepath.Join(dir, "state")})
	if err == nil || !strings.Contains(err.Error(), "operators[0].order") || !strings.Contains(err.Error(), "declares keyed state") {
		t.Fatalf("%v", err)
	}
}
