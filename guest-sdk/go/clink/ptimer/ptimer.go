// Package ptimer gives a clink operator processing-time timers (docs/abi.md,
// "processing_timer_register"): Register and Delete, and the clink_on_processing_timer export
// through which the host fires them. A fired processing-time timer runs the operator's
// OnTimer (clink.TimerHandler), in the timer key's context, with Fired reporting true:
//
//	func (o *op) OnTimer(key []byte, ts int64) error {
//		if ptimer.Fired() {
//			return o.idle(key, ts) // a processing-time timer
//		}
//		return o.window(key, ts) // an event-time timer
//	}
//
// The host allows processing-time timers only to modules that export
// clink_on_processing_timer (docs/abi.md, "Capabilities are exports"). It is a package of its
// own because Go links every //go:wasmexport and //go:wasmimport of a package it links (and a
// change to package clink changes every module's build ID): modules that do not import it
// stay exactly as they were.
package ptimer

import "github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"

var fired bool

// Fired reports whether the current OnTimer call is a processing-time timer.
func Fired() bool { return fired }

// Register registers a processing-time timer for the current key at timestamp (ms since the
// Unix epoch, the clock of clink.ProcessingTime). It fires once, through the operator's
// OnTimer with Fired true, when the host's clock reaches it; registering the same
// (key, timestamp) twice fires it once. Allowed in Process and OnTimer.
func Register(timestamp int64) error {
	if rc := register(timestamp); rc < 0 {
		return &clink.Error{Op: "register processing-time timer", Code: clink.Code(rc)}
	}
	return nil
}

// Delete deletes the current key's processing-time timer at timestamp; deleting an absent
// timer succeeds.
func Delete(timestamp int64) error {
	if rc := unregister(timestamp); rc < 0 {
		return &clink.Error{Op: "delete processing-time timer", Code: clink.Code(rc)}
	}
	return nil
}
