//go:build !wasip1

package clink_test

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/clinktest"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/ptimer"
)

// testOp exercises every part of the SDK; the record value is a command.
var (
	kv  = clink.NewState("kv")
	big = clink.NewState("big.values")
	geo = clink.NewEndpoint("geo")
	// Two prefetched states, so that the second frame's offset depends on the first's cap.
	pf  = clink.NewState("pf", clink.Prefetch())
	pf2 = clink.NewState("pf2", clink.Prefetch())
)

type testOp struct{ opened, closed int }

var op = &testOp{}

func init() { clink.Register("sdk-test", op) }

func (o *testOp) Open() error {
	o.opened++
	if err := clink.Emit(nil, []byte(`"open"`)); !errors.Is(err, clink.ErrNotAllowed) {
		return errors.New("Emit in Open: got " + fmt.Sprint(err) + ", want ErrNotAllowed")
	}
	if _, _, err := pf.Get(nil); !errors.Is(err, clink.ErrNotAllowed) {
		return errors.New("prefetched Get in Open: got " + fmt.Sprint(err) + ", want ErrNotAllowed")
	}
	return nil
}
func (o *testOp) Close() error { o.closed++; return clink.Emit(nil, []byte(`"closed"`)) }

func (o *testOp) OnTimer(key []byte, ts int64) error {
	if ptimer.Fired() {
		return clink.Emit(key, []byte(`{"ptimer":`+strconv.FormatInt(ts, 10)+`,"now":`+strconv.FormatInt(clink.ProcessingTime(), 10)+`}`))
	}
	if n, found, err := pf.GetInt64(nil); err != nil || found {
		// A timer gets the key's frames too: read, write back.
		if err := pf.PutInt64(nil, n+ts); err != nil {
			return err
		}
		return clink.Emit(key, []byte(`{"timer":`+strconv.FormatInt(ts, 10)+`,"pf":`+strconv.FormatInt(n, 10)+`}`))
	}
	return clink.Emit(key, []byte(`{"timer":`+strconv.FormatInt(ts, 10)+`}`))
}

func (o *testOp) Process(r *clink.Record) error {
	cmd, arg, _ := strings.Cut(string(r.Value), " ")
	switch cmd {
	case "count":
		n, _, err := kv.GetInt64(nil)
		if err != nil {
			return err
		}
		if err := kv.PutInt64(nil, n+1); err != nil {
			return err
		}
		return clink.Emit(r.Key, strconv.AppendInt(nil, n+1, 10))
	case "big":
		size, _ := strconv.Atoi(arg)
		if err := big.Put([]byte("e"), bytes.Repeat([]byte("x"), size)); err != nil {
			return err
		}
		v, found, err := big.Get([]byte("e"))
		if err != nil || !found || len(v) != size {
			return errors.New("big: get " + strconv.Itoa(len(v)) + " " + strconv.FormatBool(found))
		}
		mine, found, err := big.AppendGet([]byte("prefix:"), []byte("e"))
		if err != nil || !found || len(mine) != size+7 {
			return errors.New("big: appendget")
		}
		return clink.Emit(r.Key, strconv.AppendInt(nil, int64(len(v)), 10))
	case "delete":
		if err := kv.Delete(nil); err != nil {
			return err
		}
		_, found, err := kv.Get(nil)
		if found || err != nil {
			return errors.New("delete: still found")
		}
		return nil
	case "timer":
		ts, _ := strconv.ParseInt(arg, 10, 64)
		return clink.RegisterTimer(ts)
	case "ptimer", "unptimer":
		return processingTimerCmd(cmd, arg)
	case "fail":
		return errors.New("failing as asked")
	case "panic":
		var m map[string]int
		//lint:ignore SA5000 a deliberate runtime panic, which the SDK must recover
		m["x"] = 1
	case "lookup":
		status, body, err := geo.Lookup("GET", "/ip/"+arg, []clink.Header{{Name: "Accept", Value: "text/plain"}}, nil)
		if err != nil {
			if errors.Is(err, clink.ErrLookupTimeout) {
				return clink.Emit(r.Key, []byte(`"timeout"`))
			}
			return err
		}
		return clink.Emit(r.Key, []byte(strconv.Itoa(status)+" "+string(body)))
	case "inject":
		_, _, err := geo.Lookup("GET", "/x\nHost: evil", nil, nil)
		if errors.Is(err, clink.ErrLookupRefused) {
			return nil
		}
		return errors.New("header injection not refused")
	case "log":
		clink.Logf(clink.LevelWarn, "watermark %d", clink.Watermark())
	default:
		return fastPath(r, cmd, arg)
	}
	return nil
}

func TestSDK(t *testing.T) {
	h, err := clinktest.New()
	if err != nil {
		t.Fatal(err)
	}
	if m := h.Manifest(); m.Name != "sdk-test" || strings.Join(m.States, ",") != "kv,big.values,pf,pf2" ||
		strings.Join(m.Prefetch, ",") != "pf,pf2" || strings.Join(m.Endpoints, ",") != "geo" {
		t.Fatalf("manifest %+v", m)
	}
	if op.opened != 1 {
		t.Fatalf("opened %d", op.opened)
	}
	expect := func(key, value string, want ...string) {
		t.Helper()
		out, err := h.Process([]byte(key), []byte(value), 5)
		if err != nil {
			t.Fatalf("%s: %v", value, err)
		}
		var got []string
		for _, o := range out {
			got = append(got, string(o.Value))
		}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("%s: got %q, want %q", value, got, want)
		}
	}
	expect("a", "count", "1")
	expect("a", "count", "2")
	expect("b", "count", "1")
	expect("a", "delete")
	expect("a", "count", "1")
	expect("a", "big 100000", "100000") // larger than the result buffer: take_result path
	expect("a", "big 10", "10")
	expect("a", "inject")

	h.SetLookup(func(endpoint string, req []byte) (int, []byte, error) {
		if string(req) == "GET /ip/slow\nAccept: text/plain\n" {
			return 0, nil, clink.ErrLookupTimeout
		}
		return 200, []byte(endpoint + ":" + string(req)), nil
	})
	expect("a", "lookup 1.2.3.4", "200 geo:GET /ip/1.2.3.4\nAccept: text/plain\n")
	expect("a", "lookup slow", `"timeout"`)

	_, err = h.Process([]byte("a"), []byte("fail"), 0)
	var fe *clinktest.FaultError
	if !errors.As(err, &fe) || fe.Message != "failing as asked" {
		t.Fatalf("fail: %v", err)
	}
	_, err = h.Process([]byte("a"), []byte("panic"), 0)
	if !errors.As(err, &fe) || !strings.HasPrefix(fe.Message, "panic: assignment to entry in nil map") {
		t.Fatalf("panic: %v", err)
	}

	expect("k1", "timer 100")
	expect("k2", "timer 50")
	expect("k2", "timer 50")
	out, err := h.AdvanceWatermark(60)
	if err != nil || len(out) != 1 || string(out[0].Key) != "k2" || out[0].Timestamp != 50 {
		t.Fatalf("watermark 60: %v %v", out, err)
	}
	expect("a", "log")
	if l := h.Logs(); l[len(l)-1].Msg != "watermark 60" || l[len(l)-1].Level != 2 {
		t.Fatalf("log %+v", l[len(l)-1])
	}
	out, err = h.Close()
	if err != nil || len(out) != 2 || string(out[0].Value) != `{"timer":100}` || string(out[1].Value) != `"closed"` {
		t.Fatalf("close: %v %v", out, err)
	}
}

func TestDeclareAfterInit(t *testing.T) {
	if _, err := clinktest.New(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("NewState after the manifest did not panic")
		}
	}()
	clink.NewState("late")
}

func TestErrors(t *testing.T) {
	err := error(&clink.Error{Op: "lookup geo", Code: clink.CodeLookupBreakerOpen})
	if !errors.Is(err, clink.ErrLookupBreakerOpen) || errors.Is(err, clink.ErrLookupTimeout) {
		t.Fatal("errors.Is")
	}
	var ce *clink.Error
	if !errors.As(err, &ce) || !ce.Retryable() || err.Error() != "clink: lookup geo: LOOKUP_BREAKER_OPEN" {
		t.Fatalf("%v", err)
	}
	if (&clink.Error{Code: clink.CodeLookupRefused}).Retryable() {
		t.Fatal("refused is not retryable")
	}
	if s := clink.Code(-9).String(); s != "code(-9)" {
		t.Fatal(s)
	}
}
