// Processing-time timers (docs/abi.md, "processing_timer_register"). An operator that
// registers them (registerProcessingTimer) sets the function that handles them, and re-exports
// the export that fires it, from its entry file:
//
//     export * from "@clink-wasm/sdk/assembly/exports";
//     export { clink_on_processing_timer } from "@clink-wasm/sdk/assembly/ptimer";
//     import { setProcessingTimerHandler } from "@clink-wasm/sdk/assembly/ptimer";
//     setProcessingTimerHandler((key: Bytes, timestamp: i64): void => { ... });
//
// The handler runs in the timer key's context, like Operator.onTimer: state, emit, timers and
// lookups are available. It is kept out of exports.ts (and out of Operator) because the host
// allows processing_timer_register only to modules that export clink_on_processing_timer
// (capabilities are exports), and so that modules without it stay exactly as they were.

import { Bytes } from "./bytes";
import { keyedTimerCall } from "./operator";

let handler: ((key: Bytes, timestamp: i64) => void) | null = null;

/** Installs the processing-time timer handler. Call it at the top level of the entry file. */
export function setProcessingTimerHandler(fn: (key: Bytes, timestamp: i64) => void): void {
  handler = fn;
}

export function clink_on_processing_timer(keyLen: u32, timestamp: i64): i32 {
  let fn = handler;
  if (!fn) throw new Error("a processing-time timer fired but no handler is set (setProcessingTimerHandler)");
  return keyedTimerCall(keyLen, timestamp, fn);
}
