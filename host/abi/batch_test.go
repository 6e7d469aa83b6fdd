package abi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// batchRec is recHandler for batch calls: it records which batch record each emit and log
// belongs to.
type batchRec struct {
	*recHandler
	cur  int
	sel  []int // every SelectRecord
	emit []string
}

func (h *batchRec) SelectRecord(i int) { h.cur = i; h.sel = append(h.sel, i) }
func (h *batchRec) Emit(key, value []byte) error {
	h.emit = append(h.emit, fmt.Sprintf("%d:%s=%s", h.cur, key, value))
	return nil
}

func runBatch(t *testing.T, lim Limits, values ...string) (*batchRec, int, error) {
	t.Helper()
	m := load(t, newEngine(t, lim), "batch")
	if !m.HasBatch() {
		t.Fatal("HasBatch is false for a module that exports clink_process_batch")
	}
	h := &batchRec{recHandler: newRec()}
	in, err := m.Instantiate(context.Background(), h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(context.Background()) })
	var recs []BatchRecord
	for i, v := range values {
		recs = append(recs, BatchRecord{Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(v), TS: int64(i)})
	}
	done, err := in.ProcessBatch(recs)
	if err != nil && !in.Broken() {
		t.Errorf("ProcessBatch failed (%v) but the instance is not broken", err)
	}
	return h, done, err
}

// TestProcessBatch: each record's outputs reach the handler while it serves that record, in
// order, whether they went through the output area (split by out_end), the emit import or a
// flush in the middle of the batch.
func TestProcessBatch(t *testing.T) {
	h, done, err := runBatch(t, Limits{}, "", "e", "", "f", "")
	if err != nil || done != 5 {
		t.Fatalf("%d of 5 done: %v", done, err)
	}
	var want []string
	want = append(want, "0:k0=r0", "1:k1=e1", "2:k2=r2")
	for range (1024 - 4 - 2*12) / 12 { // what fills the area after records 0 and 2
		want = append(want, "3:k3=f3")
	}
	want = append(want, "3:k3=r3", "4:k4=r4")
	if strings.Join(h.emit, " ") != strings.Join(want, " ") {
		t.Errorf("emits:\n got %v\nwant %v", h.emit, want)
	}
}

// TestProcessBatchFaults: a batch that goes wrong is the fault of the record the guest was on,
// the records before it completed and those after it not.
func TestProcessBatchFaults(t *testing.T) {
	for _, tc := range []struct {
		values []string
		done   int
		kind   FaultKind
		msg    string
		emits  string
	}{
		{[]string{"", "", "r", ""}, 2, FaultReturn, "returned error status 5", "0:k0=r0 1:k1=r1"},
		{[]string{"", "t", ""}, 1, FaultTrap, "unreachable", "0:k0=r0"},
		// A cursor that moves back or past the batch is the fault of the record the host last
		// served.
		{[]string{"", "e", "b"}, 1, FaultABI, "current record moved from 1 to 0", "0:k0=r0 1:k1=e1"},
		{[]string{"", "x"}, 0, FaultABI, "current record moved from 0 to 2", ""},
		{[]string{"o", ""}, 0, FaultABI, "out_end 1000", ""},
		{[]string{"", "l"}, 1, FaultABI, "record 1 of the batch has out_end 0 outside", "0:k0=r0"},
		{[]string{"", "p"}, 1, FaultABI, "holds 12 bytes past the last record's out_end", "0:k0=r0"},
		{[]string{"g", ""}, 0, FaultABI, "record 0 of the batch returned 3, but the batch went on", ""},
	} {
		t.Run(strings.Join(tc.values, ","), func(t *testing.T) {
			h, done, err := runBatch(t, Limits{}, tc.values...)
			var f *Fault
			if !errors.As(err, &f) || f.Kind != tc.kind || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want a %v fault saying %q", err, tc.kind, tc.msg)
			}
			if f.Export != ExportProcessBatch {
				t.Errorf("fault names export %q", f.Export)
			}
			if done != tc.done {
				t.Errorf("%d records done, want %d", done, tc.done)
			}
			if got := strings.Join(h.emit, " "); got != tc.emits {
				t.Errorf("emits %q, want %q", got, tc.emits)
			}
		})
	}
}

// TestProcessBatchTimeLimit: the time limit applies to each record of a batch, not to the
// call. White-box, so that nothing depends on how fast this machine runs: a call whose budget
// began an hour ago fails its next check, unless the guest's cursor moved to the next record
// since, which restarts the budget (syncBatch runs at every import and fuel check).
func TestProcessBatchTimeLimit(t *testing.T) {
	m := load(t, newEngine(t, Limits{CallTime: 100 * time.Millisecond}), "batch")
	h := &batchRec{recHandler: newRec()}
	in, err := m.Instantiate(context.Background(), h)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close(context.Background())
	if err := in.ensureInput(4096); err != nil {
		t.Fatal(err)
	}
	b := &in.batch
	b.on, b.n, b.cur, b.hdr = true, 3, 0, in.inPtr
	defer func() { b.on = false }()
	overdue := func() {
		in.budgetSeq = in.seq
		in.budgetStart = monotonic() - time.Hour
	}
	// The cursor stays on record 0: the hour-old budget fails.
	in.mem.WriteUint32Le(in.inPtr+4, 0)
	overdue()
	in.syncBatch()
	if err := in.checkBudget(); err == nil {
		t.Fatal("a record that ran for an hour passed its budget check")
	}
	// The cursor moved to record 1: its budget starts now.
	in.mem.WriteUint32Le(in.inPtr+4, 1)
	overdue()
	in.syncBatch()
	if err := in.checkBudget(); err != nil {
		t.Fatalf("the next record inherited the previous one's time: %v", err)
	}
	if h.cur != 1 {
		t.Errorf("the handler serves record %d, want 1", h.cur)
	}
}
