package sdktest

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// batchHandler serves batch calls (docs/abi.md, "Batch calls"): each record of a batch has its
// own key and its own list of outputs.
type batchHandler struct {
	*handler
	keys []string
	outs [][]output
	cur  int
}

func (b *batchHandler) SelectRecord(i int) {
	b.outs[b.cur] = b.handler.out
	b.cur = i
	b.handler.key, b.handler.out = b.keys[i], b.outs[i]
}

// batch runs the records (key, value) as one clink_process_batch call and returns each
// record's outputs and how many completed.
func (b *batchHandler) batch(t *testing.T, in *abi.Instance, recs [][2]string) ([][]output, int, error) {
	b.keys, b.outs, b.cur = nil, make([][]output, len(recs)), 0
	var br []abi.BatchRecord
	for _, r := range recs {
		b.keys = append(b.keys, r[0])
		br = append(br, abi.BatchRecord{Key: []byte(r[0]), Value: []byte(r[1]), TS: 7})
	}
	b.handler.key, b.handler.out = b.keys[0], nil
	done, err := in.ProcessBatch(br)
	b.outs[b.cur] = b.handler.out
	b.handler.out = nil
	return b.outs, done, err
}

func loadBatch(t *testing.T, path string) (*batchHandler, *abi.Instance, *instance) {
	t.Helper()
	m := module(t, path)
	if !m.HasBatch() {
		t.Skipf("%s does not export clink_process_batch", path)
	}
	bh := &batchHandler{handler: newHandler(t)}
	in, err := m.Instantiate(context.Background(), bh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(context.Background()) })
	return bh, in, &instance{t: t, h: bh.handler, in: in, manifest: m.Manifest}
}

// TestConformanceBatch runs the conformance script with every record step in the middle of a
// batch call, between records of other keys: each step must emit, write and read exactly what
// it does in a call of its own (frames, the output area, imports, lookups, large values).
func TestConformanceBatch(t *testing.T) {
	for _, path := range conformanceModules {
		t.Run(strings.TrimSuffix(path[strings.LastIndexByte(path, '/')+1:], ".wasm"), func(t *testing.T) {
			if strings.HasSuffix(path, "-go.wasm") && testing.Short() {
				t.Skip("-short: skipping the Go module")
			}
			bh, _, inst := loadBatch(t, path)
			pfIndex := uint32(slices.Index(inst.manifest.States, "pf"))
			for i, s := range script {
				var got []string
				if s.cmd == "" {
					out, err := inst.advance(s.advance)
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					for _, o := range out {
						got = append(got, o.value)
					}
				} else {
					outs, done, err := bh.batch(t, inst.in, [][2]string{{"zz-before", "get x"}, {s.key, s.cmd}, {"zz-after", "count"}})
					if err != nil || done != 3 {
						t.Fatalf("step %d (%q): %d of 3 done: %v", i, s.cmd, done, err)
					}
					for _, o := range outs[1] {
						got = append(got, o.value)
						if o.key != s.key {
							t.Errorf("step %d: emitted key %q, want the record key %q", i, o.key, s.key)
						}
					}
				}
				if s.check != nil {
					if err := s.check(got); err != nil {
						t.Errorf("step %d (%.40q): got %.200q: %v", i, s.cmd, got, err)
					}
				} else if !slices.Equal(got, s.want) {
					t.Errorf("step %d (%.40q): got %.200q, want %.200q", i, s.cmd, got, s.want)
				}
				if s.stored != "" {
					v, ok := bh.stored(s.key, pfIndex, "")
					switch {
					case !ok:
						v = "absent"
					case v == "":
						v = "empty"
					}
					if v != s.stored {
						t.Errorf("step %d (%.40q): host holds %.40q, want %.40q", i, s.cmd, v, s.stored)
					}
				}
			}
		})
	}
}

// TestConformanceBatchFault: a record that fails in the middle of a batch is the fault, with
// its own message; the records before it are complete, and its writes are discarded.
func TestConformanceBatchFault(t *testing.T) {
	for _, path := range conformanceModules {
		t.Run(strings.TrimSuffix(path[strings.LastIndexByte(path, '/')+1:], ".wasm"), func(t *testing.T) {
			if strings.HasSuffix(path, "-go.wasm") && testing.Short() {
				t.Skip("-short: skipping the Go module")
			}
			for _, tc := range []struct{ cmd, msg string }{
				{"fail boom", "failed on purpose: boom"},
				{"pfail lost", "failed on purpose after a write"},
			} {
				bh, in, _ := loadBatch(t, path)
				outs, done, err := bh.batch(t, in, [][2]string{{"a", "put e=1"}, {"k", tc.cmd}, {"b", "put e=2"}})
				if done != 1 {
					t.Fatalf("%s: %d records done, want 1 (the one before the failure)", tc.cmd, done)
				}
				if msg := guestMessage(err); !strings.HasPrefix(msg, tc.msg) {
					t.Errorf("%s: got %v, want a fault with message %q", tc.cmd, err, tc.msg)
				}
				if len(outs[1]) != 0 || len(outs[2]) != 0 {
					t.Errorf("%s: the failed record or the one after it delivered %q %q", tc.cmd, outs[1], outs[2])
				}
				for k := range bh.state {
					if !strings.HasPrefix(k, "a\x00") {
						t.Errorf("%s: state of another record than the completed one changed: %q", tc.cmd, k)
					}
				}
			}
		})
	}
}

// TestConformanceBatchFlushKeepsFrames: a record whose outputs overflow the output area
// flushes it in the middle of a batch, which delivers the earlier records' outputs then; their
// prefetch frames are still applied when the call returns, and so are the later records'.
func TestConformanceBatchFlushKeepsFrames(t *testing.T) {
	for _, path := range conformanceModules {
		t.Run(strings.TrimSuffix(path[strings.LastIndexByte(path, '/')+1:], ".wasm"), func(t *testing.T) {
			if strings.HasSuffix(path, "-go.wasm") && testing.Short() {
				t.Skip("-short: skipping the Go module")
			}
			bh, _, inst := loadBatch(t, path)
			outs, done, err := bh.batch(t, inst.in, [][2]string{{"p1", "pcount"}, {"e", "emitmany 1000 200"}, {"p2", "pcount"}})
			if err != nil || done != 3 {
				t.Fatalf("%d of 3 done: %v", done, err)
			}
			if len(outs[1]) != 1000 || len(outs[0]) != 1 || len(outs[2]) != 1 {
				t.Fatalf("outputs per record: %d, %d, %d; want 1, 1000, 1", len(outs[0]), len(outs[1]), len(outs[2]))
			}
			for _, k := range []string{"p1", "p2"} {
				out, err := inst.process(k, "pcount", 8)
				if err != nil {
					t.Fatal(err)
				}
				if want := `{"pf":2,"pf2":20}`; len(out) != 1 || out[0].value != want {
					t.Errorf("%s after the batch: %q, want %q (the batch's frame write-back applied)", k, out, want)
				}
			}
		})
	}
}
