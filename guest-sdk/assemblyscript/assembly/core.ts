// Emitting, timers and time (docs/abi.md, "emit", "timer_register", "watermark").

import * as abi from "./abi";
import { Bytes, view, keyScratch, valueScratch } from "./bytes";
import { emitRecord } from "./fastpath";

const keyView = new Bytes();
const valueView = new Bytes();

/**
 * Emits an output record with the given key (may be empty) and value, stamped with the
 * timestamp of the record or timer being processed. The SDK copies both. For JSON Lines
 * output the value must be one JSON value without a newline, or the host fails the pipeline.
 * Allowed in process, onTimer and close. Returns 0 or a negative Code.
 *
 * Records are buffered in the output area (docs/abi.md, "The output area") and delivered, in
 * order, when the call returns. The host checks them then: a record over the pipeline's emit
 * limits fails the call rather than return TOO_LARGE, except a record larger than the area
 * (4 KiB), which goes to the emit import directly.
 */
export function emit<K, V>(key: K, value: V): i32 {
  // Bytes and Buffers, the common arguments, are read directly, without a view.
  let kp: usize, kl: i32, vp: usize, vl: i32;
  if (key instanceof Bytes) {
    kp = key.ptr;
    kl = key.length;
  } else {
    let k = view<K>(key, keyView, keyScratch);
    kp = k.ptr;
    kl = k.length;
  }
  if (value instanceof Bytes) {
    vp = value.ptr;
    vl = value.length;
  } else {
    let v = view<V>(value, valueView, valueScratch);
    vp = v.ptr;
    vl = v.length;
  }
  return emitRecord(kp, <u32>kl, vp, <u32>vl);
}

/**
 * Registers an event-time timer for the current key at timestamp (ms); it fires once, through
 * Operator.onTimer, when the watermark reaches it. Returns 0 or a negative Code.
 */
export function registerTimer(timestamp: i64): i32 {
  return abi.timer_register(timestamp);
}

/** Deletes the current key's timer at timestamp. Returns 0 or a negative Code. */
export function deleteTimer(timestamp: i64): i32 {
  return abi.timer_delete(timestamp);
}

/**
 * Registers a processing-time timer for the current key at timestamp (ms since the Unix epoch,
 * the clock of processingTime()); it fires once, through the handler set with
 * setProcessingTimerHandler, when the host's clock reaches it. The entry file must re-export
 * clink_on_processing_timer from "@clink-wasm/sdk/assembly/ptimer". Returns 0 or a negative Code.
 */
export function registerProcessingTimer(timestamp: i64): i32 {
  return abi.processing_timer_register(timestamp);
}

/** Deletes the current key's processing-time timer at timestamp. Returns 0 or a negative Code. */
export function deleteProcessingTimer(timestamp: i64): i32 {
  return abi.processing_timer_delete(timestamp);
}

/**
 * Gives the current call's next suspensions (in get and lookup) a priority: when several
 * suspended calls have their values ready at the same moment, those with a lower order resume
 * first; ties resume in arrival order. Use a deadline in ms, or any order key; the default is 0.
 * It matters only when the pipeline enables priority resumption, never changes per-key order,
 * and is ignored outside process and onTimer.
 */
export function setResumeOrder(order: i64): void {
  abi.set_resume_order(order);
}

/** The watermark before the first one. */
export const WATERMARK_NONE: i64 = i64.MIN_VALUE;
/** The watermark at end of input. */
export const WATERMARK_END: i64 = i64.MAX_VALUE;

/** The current event-time watermark (ms). */
export function watermark(): i64 {
  return abi.watermark();
}

/** Wall-clock time, ms since the Unix epoch. */
export function processingTime(): i64 {
  return abi.processing_time();
}
