package clink

import (
	"math"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"
)

// Watermark values with a special meaning.
const (
	WatermarkNone = math.MinInt64 // before the first watermark
	WatermarkEnd  = math.MaxInt64 // end of input
)

// Watermark returns the current event-time watermark (ms): every record with a timestamp at or
// below it has been seen. It never moves backwards within a key.
func Watermark() int64 { return abi.Watermark() }

// ProcessingTime returns the wall-clock time in ms since the Unix epoch.
func ProcessingTime() int64 { return abi.ProcessingTime() }

// SetResumeOrder gives the current call's next suspensions (in Get and Lookup) a priority:
// when several suspended calls have their values ready at the same moment, those with a lower
// order resume first; ties resume in arrival order. Use a deadline in ms, or any order key; the
// default is 0. It matters only when the pipeline enables priority resumption, never changes
// per-key order, and is ignored outside Process and OnTimer.
func SetResumeOrder(order int64) { abi.SetResumeOrder(order) }

// RegisterTimer registers an event-time timer for the current key at timestamp (ms). It fires
// once, through the operator's OnTimer, when the watermark reaches timestamp; registering the
// same (key, timestamp) twice fires it once. Allowed in Process and OnTimer only, and only if
// the operator implements TimerHandler.
func RegisterTimer(timestamp int64) error {
	if _, ok := op.(TimerHandler); !ok {
		return &Error{Op: "register timer", Code: CodeNotAllowed}
	}
	if rc := abi.TimerRegister(timestamp); rc < 0 {
		return codeErr("register timer", int64(rc))
	}
	return nil
}

// DeleteTimer deletes the current key's timer at timestamp; deleting an absent timer succeeds.
func DeleteTimer(timestamp int64) error {
	if rc := abi.TimerDelete(timestamp); rc < 0 {
		return codeErr("delete timer", int64(rc))
	}
	return nil
}
