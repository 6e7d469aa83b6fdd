//go:build !wasip1

package clink_test

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/clinktest"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/jsonx"
)

// fastPath serves the commands of testOp that exercise the fast paths (docs/abi.md, "Fast
// paths"): pf and pf2 are prefetched, and every Emit goes through the output area.
func fastPath(r *clink.Record, cmd, arg string) error {
	switch cmd {
	case "nop": // the baseline of TestHotPathAllocatesNothing
		return nil
	case "hot": // the counter example's per-record work (TestHotPathAllocatesNothing)
		n, _, err := pf.GetInt64(nil)
		if err != nil {
			return err
		}
		if err := pf.PutInt64(nil, n+1); err != nil {
			return err
		}
		hotOut = append(hotOut[:0], `{"key":`...)
		hotOut = jsonx.AppendString(hotOut, r.Key)
		hotOut = append(hotOut, `,"count":`...)
		hotOut = jsonx.AppendInt(hotOut, n+1)
		hotOut = append(hotOut, '}')
		return clink.Emit(r.Key, hotOut)
	case "pcount": // the counter's read-modify-write, on both frames
		n, _, err := pf.GetInt64(nil)
		if err != nil {
			return err
		}
		if err := pf.PutInt64(nil, n+1); err != nil {
			return err
		}
		m, _, err := pf2.GetInt64(nil)
		if err != nil {
			return err
		}
		if err := pf2.PutInt64(nil, m+10); err != nil {
			return err
		}
		return clink.Emit(r.Key, []byte(strconv.FormatInt(n+1, 10)+","+strconv.FormatInt(m+10, 10)))
	case "pget":
		return emitGet(r.Key)
	case "pput": // pput V: write, then read back in the same call
		if err := pf.Put(nil, []byte(arg)); err != nil {
			return err
		}
		return emitGet(r.Key)
	case "pputs": // pputs A B C...: several writes in one call, each read back
		for _, v := range strings.Fields(arg) {
			if err := pf.Put(nil, []byte(v)); err != nil {
				return err
			}
			if err := emitGet(r.Key); err != nil {
				return err
			}
		}
		return nil
	case "pdel":
		if err := pf.Delete(nil); err != nil {
			return err
		}
		return emitGet(r.Key)
	case "pentry": // a non-empty entry of a prefetched state goes through the imports
		if err := pf.Put([]byte("x"), []byte(arg)); err != nil {
			return err
		}
		v, found, err := pf.Get([]byte("x"))
		if err != nil || !found {
			return errors.New("pentry: not found")
		}
		return clink.Emit(r.Key, []byte(`"x=`+string(v)+`"`))
	case "pfail": // write, then fail: the write must not reach the state
		if err := pf.Put(nil, []byte(arg)); err != nil {
			return err
		}
		return errors.New("failing after a write")
	case "pintover": // pintover V: an int64 into the frame, then V (too large for it) with put
		if err := pf.PutInt64(nil, 7); err != nil {
			return err
		}
		if err := pf.Put(nil, []byte(arg)); err != nil {
			return err
		}
		_, _, err := pf.GetInt64(nil) // must read V, not the 7 still in the frame
		return err
	case "pint": // GetInt64 of a value that is not 8 bytes
		_, _, err := pf.GetInt64(nil)
		return err
	case "emitmany": // emitmany N SIZE: N records of SIZE bytes
		n, size, _ := strings.Cut(arg, " ")
		count, _ := strconv.Atoi(n)
		sz, _ := strconv.Atoi(size)
		for i := range count {
			v := strconv.AppendInt(nil, int64(i), 10)
			v = append(v, bytes.Repeat([]byte(" "), max(0, sz-len(v)))...)
			if err := clink.Emit(r.Key, v); err != nil {
				return err
			}
		}
		return nil
	}
	return errors.New("unknown command " + strconv.Quote(cmd))
}

// hotOut is the "hot" command's output buffer, reused for every record.
var hotOut []byte

func emitGet(key []byte) error {
	v, found, err := pf.Get(nil)
	if err != nil {
		return err
	}
	if !found {
		return clink.Emit(key, []byte("null"))
	}
	return clink.Emit(key, []byte(strconv.Quote(string(v))))
}

func TestFastPaths(t *testing.T) {
	h, err := clinktest.New()
	if err != nil {
		t.Fatal(err)
	}
	run := func(key, value string) []string {
		t.Helper()
		out, err := h.Process([]byte(key), []byte(value), 5)
		if err != nil {
			t.Fatalf("%.40s: %v", value, err)
		}
		var got []string
		for _, o := range out {
			got = append(got, string(o.Value))
		}
		return got
	}
	expect := func(key, value string, want ...string) {
		t.Helper()
		if got := run(key, value); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("%.40s: got %.200q, want %.200q", value, got, want)
		}
	}
	stored := func(key string) string {
		v, found := h.State([]byte(key), "pf", nil)
		if !found {
			return "absent"
		}
		return strconv.Quote(string(v))
	}
	frame := strings.Repeat("f", 64)     // exactly the native host's smallest frame
	over := strings.Repeat("o", 65)      // one byte over it
	huge := strings.Repeat("h", 100_000) // over the result buffer too

	expect("a", "pcount", "1,10")
	expect("a", "pcount", "2,20")
	expect("b", "pcount", "1,10")
	expect("a", "pint")
	expect("a", "pput v1", `"v1"`)
	if got := stored("a"); got != `"v1"` {
		t.Fatalf("write-back: stored %s", got)
	}
	if _, err := h.Process([]byte("a"), []byte("pint"), 0); err == nil || !strings.Contains(err.Error(), "INVALID_ARGUMENT") {
		t.Fatalf("GetInt64 of a 2-byte value: %v", err)
	}
	expect("a", "pput "+frame, strconv.Quote(frame))
	expect("a", "pget", strconv.Quote(frame))
	// Larger than the frame: through put, and read back in the same call through get_async.
	expect("a", "pput "+over, strconv.Quote(over))
	if got := stored("a"); got != strconv.Quote(over) {
		t.Fatalf("oversized put: stored %.20s", got)
	}
	expect("a", "pget", strconv.Quote(over)) // the next call's frame is large enough
	if _, err := h.Process([]byte("c"), []byte("pintover "+over), 0); err == nil || !strings.Contains(err.Error(), "INVALID_ARGUMENT") {
		t.Fatalf("GetInt64 after an oversized put: %v", err)
	}
	if got := stored("c"); got != strconv.Quote(over) {
		t.Fatalf("int64, then an oversized put: stored %.20s", got)
	}
	expect("a", "pput "+huge, strconv.Quote(huge))
	// Small, then large, then small in one call: the last write wins, and every read sees
	// the write before it.
	expect("a", "pputs s1 "+huge+" s2", `"s1"`, strconv.Quote(huge), `"s2"`)
	if got := stored("a"); got != `"s2"` {
		t.Fatalf("small after large: stored %.20s", got)
	}
	expect("a", "pputs "+huge+" "+over, strconv.Quote(huge), strconv.Quote(over))
	if got := stored("a"); got != strconv.Quote(over) {
		t.Fatalf("large after large: stored %.20s", got)
	}
	expect("a", "pputs s3 "+huge, `"s3"`, strconv.Quote(huge))
	if got := stored("a"); got != strconv.Quote(huge) {
		t.Fatalf("large after small: stored %.20s", got)
	}
	expect("a", "pdel", "null")
	if got := stored("a"); got != "absent" {
		t.Fatalf("delete: stored %s", got)
	}
	expect("a", "pputs "+huge+" x", strconv.Quote(huge), `"x"`)
	expect("a", "pdel", "null")
	expect("a", "pget", "null")
	expect("a", "pput ", `""`) // an empty value is a value
	expect("a", "pget", `""`)
	expect("a", "pentry 7", `"x=7"`)
	expect("a", "pget", `""`)
	if _, err := h.Process([]byte("a"), []byte("pfail lost"), 0); err == nil {
		t.Fatal("pfail did not fail")
	}
	expect("a", "pget", `""`) // the failed call's write was not applied

	// Timers get frames: OnTimer reads pf and writes pf+ts back.
	expect("t", "pcount", "1,10")
	expect("t", "timer 30")
	if out, err := h.AdvanceWatermark(40); err != nil || len(out) != 1 || string(out[0].Value) != `{"timer":30,"pf":1}` {
		t.Fatalf("timer: %v %v", out, err)
	}
	expect("t", "pcount", "32,20")

	// Output area: 1,000 records of 200 bytes overflow the 64 KiB area three times; a record
	// larger than the area goes through the emit import between area records.
	got := run("e", "emitmany 1000 200")
	if len(got) != 1000 {
		t.Fatalf("emitmany: %d records", len(got))
	}
	for i, v := range got {
		if !strings.HasPrefix(v, strconv.Itoa(i)+" ") || len(v) != 200 {
			t.Fatalf("emitmany: record %d is %.20q", i, v)
		}
	}
	got = run("e", "emitmany 5 70000")
	if len(got) != 5 {
		t.Fatalf("emitmany large: %d records", len(got))
	}
	for i, v := range got {
		if !strings.HasPrefix(v, strconv.Itoa(i)+" ") || len(v) != 70000 {
			t.Fatalf("emitmany large: record %d is %.20q", i, v)
		}
	}
}

// TestProcessBatch runs records through the batch export (clink_process_batch, as clinktest
// lays a batch out) and checks that each record is what its own Process call would have been:
// its frames, its outputs (through flushes of the output area and the emit import), its
// timestamp, and a failure that stops the batch at the failed record.
func TestProcessBatch(t *testing.T) {
	h, err := clinktest.New()
	if err != nil {
		t.Fatal(err)
	}
	batch := func(cmds ...string) ([][]clinktest.Output, error) {
		t.Helper()
		recs := make([]clink.Record, len(cmds))
		for i, c := range cmds {
			key, value, _ := strings.Cut(c, ":")
			recs[i] = clink.Record{Key: []byte(key), Value: []byte(value), Timestamp: int64(100 + i)}
		}
		return h.ProcessBatch(recs)
	}
	values := func(out []clinktest.Output) string {
		var v []string
		for _, o := range out {
			v = append(v, string(o.Value))
		}
		return strings.Join(v, "|")
	}
	expect := func(out [][]clinktest.Output, want ...string) {
		t.Helper()
		if len(out) != len(want) {
			t.Fatalf("%d records' outputs, want %d", len(out), len(want))
		}
		for i, o := range out {
			if got := values(o); got != want[i] {
				t.Fatalf("record %d: got %.200q, want %.200q", i, got, want[i])
			}
			for _, r := range o {
				if r.Timestamp != int64(100+i) {
					t.Fatalf("record %d: an output with timestamp %d", i, r.Timestamp)
				}
			}
		}
	}

	// Each record reads and writes its own key's frames.
	if _, err := h.Process([]byte("b"), []byte("pcount"), 0); err != nil {
		t.Fatal(err)
	}
	out, err := batch("a:pcount", "b:pcount", "c:pput v")
	if err != nil {
		t.Fatal(err)
	}
	expect(out, "1,10", "2,20", `"v"`)
	if out, err = batch("c:pget", "a:pcount"); err != nil {
		t.Fatal(err)
	}
	expect(out, `"v"`, "2,20")

	// 400 records of 200 bytes overflow the 64 KiB area during each record (flush_output
	// mid-batch, which delivers the earlier records' part of the area to them); a record
	// larger than the area goes through the emit import.
	if out, err = batch("e1:emitmany 400 200", "e2:emitmany 400 200", "e3:emitmany 2 70000", "e4:pget"); err != nil {
		t.Fatal(err)
	}
	for i, n := range []int{400, 400, 2, 1} {
		if len(out[i]) != n {
			t.Fatalf("record %d: %d outputs, want %d", i, len(out[i]), n)
		}
		for j, o := range out[i][:n-1] {
			if !strings.HasPrefix(string(o.Value), strconv.Itoa(j)+" ") {
				t.Fatalf("record %d: output %d is %.20q", i, j, o.Value)
			}
		}
	}

	// A failed record stops the batch: the records before it are complete, its write and
	// the records after it are not applied.
	out, err = batch("f1:pput kept", "f2:pfail lost", "f3:pput never")
	if err == nil || !strings.Contains(err.Error(), "failing after a write") {
		t.Fatalf("a failing record: %v", err)
	}
	expect(out, `"kept"`)
	for key, want := range map[string]bool{"f1": true, "f2": false, "f3": false} {
		if _, found := h.State([]byte(key), "pf", nil); found != want {
			t.Fatalf("after the failed batch, %s stored: %v, want %v", key, found, want)
		}
	}

	if _, err := batch("d:pget", "d:pget"); err == nil {
		t.Fatal("a batch with a key twice was accepted")
	}
}
