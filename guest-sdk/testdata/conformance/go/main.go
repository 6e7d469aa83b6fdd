// Command conformance exercises every part of the Go SDK inside a real wasm module. The
// record value is a command; guest-sdk/sdktest runs the same script against this module and
// the AssemblyScript one (../as/index.ts) and expects the same output from both.
package main

import (
	"bytes"
	"errors"
	"runtime"
	"strconv"
	"strings"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/jsonx"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/keyfunc"
)

var (
	kv   = clink.NewState("kv")
	dict = clink.NewState("map")
	big  = clink.NewState("big")
	echo = clink.NewEndpoint("echo")
	// Two prefetched states: the second frame's place depends on the first frame's cap.
	pf  = clink.NewState("pf", clink.Prefetch())
	pf2 = clink.NewState("pf2", clink.Prefetch())
)

type op struct{}

var out []byte

var keyBuf []byte

func init() {
	clink.Register("conformance", op{})
	// Key records by their "user" field: a string unquoted, anything else as written.
	keyfunc.Set(func(value []byte) ([]byte, bool) {
		raw, ok := jsonx.Field(value, "user")
		if !ok || raw[0] != '"' {
			return raw, ok
		}
		keyBuf, ok = jsonx.AppendUnquote(keyBuf[:0], raw)
		return keyBuf, ok
	})
}

func (op) Open() error {
	if err := kv.Put(nil, []byte("x")); errors.Is(err, clink.ErrNotAllowed) {
		clink.Log(clink.LevelInfo, "open: put NOT_ALLOWED")
	}
	if err := clink.Emit(nil, []byte("1")); errors.Is(err, clink.ErrNotAllowed) {
		clink.Log(clink.LevelInfo, "open: emit NOT_ALLOWED")
	}
	if err := pf.Put(nil, []byte("x")); errors.Is(err, clink.ErrNotAllowed) {
		clink.Log(clink.LevelInfo, "open: prefetched put NOT_ALLOWED")
	}
	return nil
}

func (op) Close() error { return clink.Emit(nil, []byte(`{"closed":true}`)) }

func (op) OnTimer(key []byte, ts int64) error {
	out = append(out[:0], `{"timer":`...)
	out = jsonx.AppendInt(out, ts)
	out = append(out, `,"key":`...)
	out = jsonx.AppendString(out, key)
	// A timer gets its key's frames too: read pf2, write pf2+ts back.
	n, found, err := pf2.GetInt64(nil)
	if err != nil {
		return err
	}
	if found {
		if err := pf2.PutInt64(nil, n+ts); err != nil {
			return err
		}
		out = append(out, `,"pf2":`...)
		out = jsonx.AppendInt(out, n)
	}
	out = append(out, '}')
	return clink.Emit(key, out)
}

// emitGet emits {"get":V} for pf's value, or {"get":null}.
func emitGet(key []byte) error {
	v, found, err := pf.Get(nil)
	if err != nil {
		return err
	}
	if !found {
		return emitf(key, `{"get":null}`)
	}
	return emitf(key, `{"get":`, string(jsonx.AppendString(nil, v)), `}`)
}

// padded is a JSON string of size bytes that starts with i: "17     ".
func padded(i, size int) []byte {
	b := append([]byte{'"'}, strconv.Itoa(i)...)
	for len(b) < size-1 {
		b = append(b, ' ')
	}
	return append(b, '"')
}

func emitf(key []byte, parts ...string) error {
	out = out[:0]
	for _, p := range parts {
		out = append(out, p...)
	}
	return clink.Emit(key, out)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func lookupResult(key []byte, status int, body []byte, err error) error {
	if err != nil {
		var ce *clink.Error
		if !errors.As(err, &ce) {
			return err
		}
		return emitf(key, `{"error":"`, ce.Code.String(), `","retryable":`, strconv.FormatBool(ce.Retryable()), `}`)
	}
	return emitf(key, `{"status":`, strconv.Itoa(status), `,"body":`, string(jsonx.AppendString(nil, body)), `}`)
}

func (op) Process(r *clink.Record) error {
	cmd, arg, _ := strings.Cut(string(r.Value), " ")
	k := r.Key
	switch cmd {
	case "count":
		n, _, err := kv.GetInt64(nil)
		if err != nil {
			return err
		}
		n++
		if err := kv.PutInt64(nil, n); err != nil {
			return err
		}
		return emitf(k, `{"count":`, itoa(n), `}`)
	case "put":
		e, v, _ := strings.Cut(arg, "=")
		return dict.Put([]byte(e), []byte(v))
	case "get":
		v, found, err := dict.Get([]byte(arg))
		if err != nil {
			return err
		}
		if !found {
			return emitf(k, `{"get":null}`)
		}
		return emitf(k, `{"get":`, string(jsonx.AppendString(nil, v)), `}`)
	case "del":
		return dict.Delete([]byte(arg))
	case "big":
		n, _ := strconv.Atoi(arg)
		val := bytes.Repeat([]byte("abcdefg"), n/7+1)[:n]
		if err := big.Put([]byte("e"), val); err != nil {
			return err
		}
		got, found, err := big.Get([]byte("e"))
		if err != nil || !found || !bytes.Equal(got, val) {
			return errors.New("big: Get returned something else")
		}
		mine, found, err := big.AppendGet([]byte("prefix"), []byte("e"))
		if err != nil || !found || string(mine[:6]) != "prefix" || !bytes.Equal(mine[6:], val) {
			return errors.New("big: AppendGet returned something else")
		}
		return emitf(k, `{"big":`, strconv.Itoa(len(got)), `}`)
	case "has":
		_, found, err := big.Get([]byte("e"))
		if err != nil {
			return err
		}
		return emitf(k, `{"has":`, strconv.FormatBool(found), `}`)
	case "timer":
		ts, _ := strconv.ParseInt(arg, 10, 64)
		return clink.RegisterTimer(ts)
	case "deltimer":
		ts, _ := strconv.ParseInt(arg, 10, 64)
		return clink.DeleteTimer(ts)
	case "lookup":
		status, body, err := echo.Lookup("GET", arg, []clink.Header{{Name: "X-Test", Value: "1"}}, nil)
		return lookupResult(k, status, body, err)
	case "post":
		status, body, err := echo.Lookup("POST", "/echo", nil, []byte(arg))
		return lookupResult(k, status, body, err)
	case "inject":
		status, body, err := echo.Lookup("GET", "/x\nHost: evil", nil, nil)
		return lookupResult(k, status, body, err)
	case "order":
		n, _ := strconv.ParseInt(arg, 10, 64)
		clink.SetResumeOrder(n)
		return nil
	case "hot":
		// The counter example's hot path: state read and write, JSON output, emit.
		n, _, err := kv.GetInt64([]byte("hot"))
		if err != nil {
			return err
		}
		n++
		if err := kv.PutInt64([]byte("hot"), n); err != nil {
			return err
		}
		out = append(out[:0], `{"key":`...)
		out = jsonx.AppendString(out, k)
		out = append(out, `,"hot":`...)
		out = jsonx.AppendInt(out, n)
		out = append(out, '}')
		return clink.Emit(k, out)
	case "phot":
		// The counter example's hot path on a prefetched state: no import call.
		n, _, err := pf2.GetInt64(nil)
		if err != nil {
			return err
		}
		n++
		if err := pf2.PutInt64(nil, n); err != nil {
			return err
		}
		out = append(out[:0], `{"key":`...)
		out = jsonx.AppendString(out, k)
		out = append(out, `,"phot":`...)
		out = jsonx.AppendInt(out, n)
		out = append(out, '}')
		return clink.Emit(k, out)
	case "pcount":
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
		return emitf(k, `{"pf":`, itoa(n+1), `,"pf2":`, itoa(m+10), `}`)
	case "pget":
		return emitGet(k)
	case "phas":
		_, found, err := pf.Get(nil)
		if err != nil {
			return err
		}
		return emitf(k, `{"has":`, strconv.FormatBool(found), `}`)
	case "pputs": // each space-separated value in turn: write it, read it back
		// (strings.Cut, not strings.Split: Split would make the command string escape, and
		// TestGoHotPathAllocations counts the module's allocations.)
		for rest, more := arg, true; more; {
			var v string
			v, rest, more = strings.Cut(rest, " ")
			if err := pf.Put(nil, []byte(v)); err != nil {
				return err
			}
			if err := emitGet(k); err != nil {
				return err
			}
		}
		return nil
	case "pdel":
		if err := pf.Delete(nil); err != nil {
			return err
		}
		return emitGet(k)
	case "pputdel": // write (maybe larger than the frame), then delete, in one call
		if err := pf.Put(nil, []byte(arg)); err != nil {
			return err
		}
		if err := pf.Delete(nil); err != nil {
			return err
		}
		return emitGet(k)
	case "pentry": // another entry of a prefetched state: through the imports
		if err := pf.Put([]byte("x"), []byte(arg)); err != nil {
			return err
		}
		v, _, err := pf.Get([]byte("x"))
		if err != nil {
			return err
		}
		return emitf(k, `{"entry":`, string(jsonx.AppendString(nil, v)), `}`)
	case "pint":
		n, _, err := pf.GetInt64(nil)
		if err != nil {
			return err
		}
		return emitf(k, `{"int":`, itoa(n), `}`)
	case "pfail": // write and emit, then fail: neither may reach the host
		if err := pf.Put(nil, []byte(arg)); err != nil {
			return err
		}
		if err := emitf(k, `{"before":true}`); err != nil {
			return err
		}
		return errors.New("failed on purpose after a write")
	case "emitmany": // emitmany N SIZE: N records of SIZE bytes
		ns, ss, _ := strings.Cut(arg, " ")
		n, _ := strconv.Atoi(ns)
		size, _ := strconv.Atoi(ss)
		for i := range n {
			if err := clink.Emit(k, padded(i, size)); err != nil {
				return err
			}
		}
		return nil
	case "emitmix": // small and large records interleaved: order must hold
		for i, size := range []int{4, 70000, 4, 5000, 4} {
			if err := clink.Emit(k, padded(i, size)); err != nil {
				return err
			}
		}
		return nil
	case "mallocs":
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		out = append(out[:0], `{"mallocs":`...)
		out = jsonx.AppendInt(out, int64(ms.Mallocs))
		out = append(out, '}')
		return clink.Emit(k, out)
	case "watermark":
		return emitf(k, `{"watermark":`, itoa(clink.Watermark()), `}`)
	case "time":
		return emitf(k, `{"time":`, itoa(clink.ProcessingTime()), `}`)
	case "log":
		clink.Log(clink.LevelDebug, "debug "+arg)
		clink.Log(clink.LevelInfo, "info "+arg)
		clink.Log(clink.LevelWarn, "warn "+arg)
		clink.Log(clink.LevelError, "error "+arg)
		return nil
	case "fail":
		return errors.New("failed on purpose: " + arg)
	case "json":
		raw, ok := jsonx.Field([]byte(arg), "v")
		if !ok {
			return emitf(k, `{"field":null}`)
		}
		n, isInt := jsonx.ParseInt(raw)
		if !isInt {
			return emitf(k, `{"field":`, string(raw), `,"int":null}`)
		}
		return emitf(k, `{"field":`, string(raw), `,"int":`, itoa(n), `}`)
	case "unquote":
		raw, ok := jsonx.Field([]byte(arg), "v")
		if !ok {
			return emitf(k, `{"unquoted":null}`)
		}
		u, ok := jsonx.AppendUnquote(nil, raw)
		if !ok {
			return emitf(k, `{"unquoted":false}`)
		}
		return emitf(k, `{"unquoted":`, string(jsonx.AppendString(nil, u)), `}`)
	case "key":
		return emitf(k, `{"key":`, string(jsonx.AppendString(nil, k)), `}`)
	case "bigemit":
		n, _ := strconv.Atoi(arg)
		return emitf(k, `"`, strings.Repeat("y", n), `"`)
	}
	return errors.New("unknown command " + strconv.Quote(cmd))
}

func main() {}
