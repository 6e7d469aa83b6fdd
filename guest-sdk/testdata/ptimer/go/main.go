// Command ptimer exercises the Go SDK's processing-time timers (package clink/ptimer) inside
// a real wasm module: "reg T" and "del T" register and delete a processing-time timer at T,
// "timer T" registers an event-time timer at T, and every timer call emits
// {"ptimer":FIRED,"ts":T,"n":N}, N being the key's count of records (state), so that the
// call's key context is visible. guest-sdk/sdktest TestGoProcessingTimers runs it.
package main

import (
	"strconv"
	"strings"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/ptimer"
)

var n = clink.NewState("n")

type op struct{}

func (op) Process(r *clink.Record) error {
	c, _, err := n.GetInt64(nil)
	if err != nil {
		return err
	}
	if err := n.PutInt64(nil, c+1); err != nil {
		return err
	}
	cmd, arg, _ := strings.Cut(string(r.Value), " ")
	ts, _ := strconv.ParseInt(arg, 10, 64)
	switch cmd {
	case "reg":
		return ptimer.Register(ts)
	case "del":
		return ptimer.Delete(ts)
	case "timer":
		return clink.RegisterTimer(ts)
	}
	return nil
}

func (op) OnTimer(key []byte, ts int64) error {
	c, _, err := n.GetInt64(nil)
	if err != nil {
		return err
	}
	out := `{"ptimer":` + strconv.FormatBool(ptimer.Fired()) + `,"ts":` + strconv.FormatInt(ts, 10) + `,"n":` + strconv.FormatInt(c, 10) + `}`
	return clink.Emit(key, []byte(out))
}

func init() { clink.Register("ptimer", op{}) }

func main() {}
