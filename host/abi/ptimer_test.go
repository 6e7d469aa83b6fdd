package abi

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
)

// ptRec is a recHandler that also serves processing-time timers.
type ptRec struct {
	*recHandler
	ptimers map[int64]bool
}

func (h *ptRec) RegisterProcessingTimer(ts int64) error { h.ptimers[ts] = true; return nil }
func (h *ptRec) DeleteProcessingTimer(ts int64) error   { delete(h.ptimers, ts); return nil }

// ptimerCodes runs one record at ts on a fresh instance of fixture name over h and returns
// the result codes of its processing_timer_register(ts) and processing_timer_delete(ts+1).
func ptimerCodes(t *testing.T, name string, h Handler, rec *recHandler, ts int64) (*Instance, [2]int32) {
	t.Helper()
	m := load(t, newEngine(t, Limits{}), name)
	in, err := m.Instantiate(context.Background(), h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(context.Background()) })
	if err := in.Process([]byte("k"), nil, ts); err != nil {
		t.Fatal(err)
	}
	v := rec.emits[len(rec.emits)-1][1]
	return in, [2]int32{int32(binary.LittleEndian.Uint32([]byte(v))), int32(binary.LittleEndian.Uint32([]byte(v[4:])))}
}

// TestProcessingTimerImports: processing_timer_register/delete reach a Handler that serves
// them, and clink_on_processing_timer fires into the module; without the export, or with a
// Handler that does not serve them, registering is NOT_ALLOWED.
func TestProcessingTimerImports(t *testing.T) {
	rec := newRec()
	h := &ptRec{recHandler: rec, ptimers: map[int64]bool{}}
	in, codes := ptimerCodes(t, "ptimer", h, rec, 42)
	if codes != [2]int32{0, 0} || !h.ptimers[42] || len(h.ptimers) != 1 || len(rec.timers) != 0 {
		t.Fatalf("codes %v, processing-time timers %v, event-time timers %v", codes, h.ptimers, rec.timers)
	}
	if !in.m.HasOnProcessingTimer() {
		t.Fatal("HasOnProcessingTimer is false")
	}
	if err := in.OnProcessingTimer([]byte("key"), 42); err != nil {
		t.Fatal(err)
	}
	if e := rec.emits[len(rec.emits)-1]; e[0] != "key" || int64(binary.LittleEndian.Uint64([]byte(e[1]))) != 42 {
		t.Fatalf("the timer call emitted %q", e)
	}
	// An event-time timer call on a module without clink_on_timer is a fault, not a
	// processing-time call.
	var f *Fault
	if err := in.OnTimer([]byte("key"), 42); !errors.As(err, &f) {
		t.Fatalf("OnTimer: %v", err)
	}

	rec2 := newRec()
	_, codes = ptimerCodes(t, "ptimer", rec2, rec2, 42)
	if codes != [2]int32{int32(NotAllowed), int32(NotAllowed)} {
		t.Fatalf("a Handler without ProcessingTimerHandler: codes %v, want NOT_ALLOWED", codes)
	}

	rec3 := newRec()
	h3 := &ptRec{recHandler: rec3, ptimers: map[int64]bool{}}
	in3, codes := ptimerCodes(t, "ptimernoexport", h3, rec3, 42)
	if codes[0] != int32(NotAllowed) || codes[1] != 0 || len(h3.ptimers) != 0 {
		t.Fatalf("a module without clink_on_processing_timer: codes %v, timers %v", codes, h3.ptimers)
	}
	if err := in3.OnProcessingTimer([]byte("key"), 42); !errors.As(err, &f) || f.Export != ExportOnProcessingTimer {
		t.Fatalf("OnProcessingTimer without the export: %v", err)
	}
}
