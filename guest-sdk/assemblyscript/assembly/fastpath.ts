// The fast paths of docs/abi.md ("Fast paths"): prefetch frames and the output area. Internal:
// State and emit use them; operator.ts opens and closes them around every export call.

import * as abi from "./abi";
import { copyBytes } from "./bytes";

// ---- prefetched values ----

/**
 * Where a prefetched state's frame is in the current call: ptr is the address of the frame's
 * header in the input buffer. It is meaningful only while keyedCall is true: a frame belongs to
 * the guest only during the process or onTimer call it was written for.
 */
// @ts-ignore: decorator
@final
export class Frame {
  ptr: usize = 0;
  /**
   * Set when the entry was written with the put import (a value larger than the frame): the
   * frame is then not DIRTY and does not hold the value, so reads go through get_async until
   * the frame is written again.
   */
  stale: bool = false;
}

const frames = new Array<Frame>();
/** The prefetched states' names, in manifest (and frame) order. */
export const prefetchNames = new Array<string>();

/** Declares a prefetched state; called by the State constructor after its own declaration. */
export function declarePrefetch(name: string): Frame {
  if (frames.length >= abi.Frame.MAX_PREFETCH) throw new Error("more than 16 prefetched states (state \"" + name + "\")");
  let f = new Frame();
  frames.push(f);
  prefetchNames.push(name);
  return f;
}

/**
 * Locates the frames of the current call, the first at p, and checks what the host wrote
 * (the input buffer ends at limit). A malformed frame most likely means a host that does not
 * know the manifest's prefetch field.
 */
// @ts-ignore: decorator
@inline
function loadFrames(p: usize, limit: usize): void {
  let n = frames.length;
  for (let i = 0; i < n; i++) {
    let f = unchecked(frames[i]);
    if (p + <usize>abi.Frame.HEADER > limit) badFrame(i, "its frame lies outside the input buffer");
    let len = load<u32>(p);
    let cap = load<u32>(p, 4);
    if (cap < abi.Frame.MIN_CAP || (cap & 7) != 0 || p + <usize>abi.Frame.HEADER + <usize>cap > limit) badFrame(i, "its frame has an invalid cap");
    if (len != abi.Frame.ABSENT && len != abi.Frame.TOO_LARGE && len > cap) badFrame(i, "its frame has len > cap");
    f.ptr = p;
    // A value too large for the frame is read (and written) through the imports.
    f.stale = len == abi.Frame.TOO_LARGE;
    p += <usize>abi.Frame.HEADER + <usize>cap;
  }
}

function badFrame(i: i32, what: string): void {
  throw new Error("prefetched state \"" + prefetchNames[i] + "\": " + what +
    " (does the host support the manifest's prefetch field? docs/abi.md, \"Prefetched values\")");
}

// ---- the output area ----
//
// emit appends records to an area registered with the host once; the host drains it when
// process, onTimer or close returns, so emitting makes no import call. When a record does not
// fit, flush_output drains the area and the record goes into the empty area; a record larger
// than the whole area goes through the emit import, after the flush, so that records leave in
// the order they were emitted.

/**
 * The output area's size. Small, because an instance's memory is what bounds how many
 * suspended calls a host can afford: with a 4 KiB area an instance still fits in one 64 KiB
 * page. A call that emits more costs one flush_output per 4 KiB.
 */
const AREA_SIZE: u32 = 4096;

let areaPtr: usize = 0;
/** 0 before the first emit, 1 once the area is registered, -1 if the host refused it. */
let areaState: i32 = 0;
/**
 * True during process, onTimer and close, the calls whose return drains the area. Elsewhere
 * emit goes to the emit import (which answers NOT_ALLOWED) rather than leave a record in the
 * area for the next call's drain.
 */
let emitting = false;

/**
 * Emits a record through the area (or the emit import). Returns 0 or a negative Code. The
 * common case, a record that fits in the registered area, is inlined into the caller: a call
 * costs more than the append itself in wazero's compiled code.
 */
// @ts-ignore: decorator
@inline
export function emitRecord(kp: usize, kl: u32, vp: usize, vl: u32): i32 {
  if (areaState > 0 && emitting) {
    let used = load<u32>(areaPtr);
    if (<u64>4 + <u64>used + <u64>8 + <u64>kl + <u64>vl <= <u64>AREA_SIZE) {
      appendRecord(used, kp, kl, vp, vl);
      return 0;
    }
  }
  return emitSlow(kp, kl, vp, vl);
}

/** emitRecord when the record does not fit, or the area is not registered yet. */
function emitSlow(kp: usize, kl: u32, vp: usize, vl: u32): i32 {
  if (emitting) {
    if (areaState == 0) registerArea();
    if (areaState > 0) {
      let need = <u64>8 + <u64>kl + <u64>vl;
      let used = load<u32>(areaPtr);
      if (<u64>4 + <u64>used + need <= <u64>AREA_SIZE) {
        appendRecord(used, kp, kl, vp, vl);
        return 0;
      }
      if (used != 0) {
        let rc = abi.flush_output();
        if (rc < 0) return rc;
      }
      if (<u64>4 + need <= <u64>AREA_SIZE) {
        appendRecord(0, kp, kl, vp, vl);
        return 0;
      }
      // Larger than the area, which is empty now: the emit import keeps the order.
    }
  }
  return abi.emit(kp, kl, vp, vl);
}

// @ts-ignore: decorator
@inline
function appendRecord(used: u32, kp: usize, kl: u32, vp: usize, vl: u32): void {
  let p = areaPtr + 4 + <usize>used;
  store<u32>(p, kl);
  store<u32>(p, vl, 4);
  copyBytes(p + 8, kp, <usize>kl);
  copyBytes(p + 8 + <usize>kl, vp, <usize>vl);
  store<u32>(areaPtr, used + 8 + kl + vl);
}

/** The output area's used bytes (0 while it is not registered): a batch record's out_end. */
// @ts-ignore: decorator
@inline
export function areaUsed(): u32 {
  return areaState > 0 ? load<u32>(areaPtr) : 0;
}

function registerArea(): void {
  let p = heap.alloc(<usize>AREA_SIZE);
  store<u32>(p, 0);
  if (abi.output_area(p, AREA_SIZE) < 0) {
    heap.free(p);
    areaState = -1;
    return;
  }
  areaPtr = p;
  areaState = 1;
}

// ---- call boundaries (operator.ts) ----

/**
 * True during process and onTimer, once the frames are located. State reads and writes the
 * frames only then; elsewhere it goes to the imports, which answer NOT_ALLOWED.
 */
export let keyedCall = false;

/**
 * Starts process or onTimer: the frames follow the record at p (the input buffer ends at
 * limit), and emits go to the area.
 */
export function beginKeyedCall(p: usize, limit: usize): void {
  if (frames.length > 0) loadFrames(p, limit);
  keyedCall = true;
  emitting = true;
}

/** Starts close: emits go to the area. */
export function beginCloseCall(): void {
  emitting = true;
}

/** Ends a call: the frames and the area belong to the host again. */
export function endCall(): void {
  emitting = false;
  keyedCall = false;
}
