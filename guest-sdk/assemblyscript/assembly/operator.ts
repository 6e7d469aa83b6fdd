// Operator registration, the manifest, and the dispatch behind the ABI exports.

import * as abi from "./abi";
import { Bytes, Buffer } from "./bytes";
import { prefetchNames, beginKeyedCall, beginCloseCall, endCall, areaUsed } from "./fastpath";
// The abort/trace/seed replacements must be compiled into every module (see runtime.ts).
import "./runtime";

/**
 * One input record. key and value are views of the host's input buffer: valid until the call
 * returns. The SDK reuses one Record for every call.
 */
// @ts-ignore: decorator
@final
export class Record {
  key: Bytes = new Bytes();
  value: Bytes = new Bytes();
  /** Event time, ms since the Unix epoch. */
  timestamp: i64 = 0;
}

/**
 * A keyed stream operator. Extend it, override process (and optionally onTimer, open, close),
 * and register an instance at the top level of your entry file:
 *
 *     class Counter extends Operator {
 *       process(record: Record): void { ... }
 *     }
 *     register("counter", new Counter());
 *
 * To fail a record, throw: `throw new Error("...")`. AssemblyScript has no exceptions, so the
 * SDK logs the message at error level and traps; the host reports it as the record's fault
 * (docs/abi.md, "Faults").
 */
export abstract class Operator {
  /** Processes one record. State, emit, timers, lookups and logs are available. */
  abstract process(record: Record): void;

  /**
   * An event-time timer registered for `key` at `timestamp` fired. Runs in the key's context,
   * like process. The default fails: override it if you register timers.
   */
  onTimer(key: Bytes, timestamp: i64): void {
    throw new Error("a timer fired but the operator does not override onTimer");
  }

  /** Per-instance setup (no key context: state and timers are not available). */
  open(): void {}

  /** Per-instance teardown; may emit (to flush a buffer). */
  close(): void {}
}

let operator: Operator | null = null;
let operatorName: string = "";
let sealed = false;

const stateNames = new Array<string>();
const endpointNames = new Array<string>();

/** Registers the module's operator. Call it once, at the top level of the entry file. */
export function register(name: string, op: Operator): void {
  if (sealed) throw new Error("register called after initialisation");
  if (operator) throw new Error("register called twice");
  if (!validName(name, 64)) throw new Error("invalid operator name \"" + name + "\": want 1-64 characters of [A-Za-z0-9_.-]");
  operator = op;
  operatorName = name;
}

/** The registered operator's name. */
export function name(): string {
  return operatorName;
}

function validName(s: string, max: i32): bool {
  let n = s.length;
  if (n < 1 || n > max) return false;
  for (let i = 0; i < n; i++) {
    let c = s.charCodeAt(i);
    if (!(c >= 0x61 && c <= 0x7A || c >= 0x41 && c <= 0x5A || c >= 0x30 && c <= 0x39 || c == 0x5F || c == 0x2E || c == 0x2D)) return false;
  }
  return true;
}

/** Declares a state or endpoint name; returns its index in the manifest. */
export function declare(kind: string, list: Array<string>, name: string, max: i32): u32 {
  if (sealed) throw new Error(kind + " \"" + name + "\" declared after initialisation: declare it at the top level");
  if (!validName(name, 128)) throw new Error("invalid " + kind + " name \"" + name + "\": want 1-128 characters of [A-Za-z0-9_.-]");
  if (list.includes(name)) throw new Error(kind + " \"" + name + "\" declared twice");
  if (list.length >= max) throw new Error("more than " + max.toString() + " " + kind + "s");
  list.push(name);
  return <u32>(list.length - 1);
}

export function declareState(name: string): u32 {
  return declare("state", stateNames, name, 256);
}

export function declareEndpoint(name: string): u32 {
  return declare("endpoint", endpointNames, name, 64);
}

// ---- dispatch (exported from exports.ts) ----

let inputPtr: usize = 0;
let inputCap: u32 = 0;
const record = new Record();
const timerKey = new Bytes();
let manifest: Buffer | null = null;

// The largest input buffer handed out; larger requests return 0 (out of memory) rather than
// trap inside the allocator.
const MAX_INPUT: u32 = 1 << 29;

// @ts-ignore: decorator
@inline
function op(): Operator {
  let o = operator;
  if (!o) noOperator();
  return changetype<Operator>(o);
}

function noOperator(): void {
  throw new Error("no operator registered: call register() at the top level of the entry file");
}

export function clink_input(cap: u32): usize {
  if (cap > MAX_INPUT) return 0;
  if (inputPtr != 0 && cap <= inputCap) return inputPtr;
  if (inputPtr != 0) heap.free(inputPtr);
  inputCap = cap < 256 ? 256 : cap;
  let pages = memory.size();
  inputPtr = heap.alloc(<usize>inputCap);
  inputGrew(pages);
  return inputPtr;
}

// The prefetch frames follow the record (or the timer's key) at the next multiple of 8
// (docs/abi.md, "Prefetched values").
// @ts-ignore: decorator
@inline
function framesAt(n: u32): usize {
  return inputPtr + ((<usize>n + 7) & ~<usize>7);
}

// A call that traps never reaches endCall, and needs not: the host discards the instance.

export function clink_process(keyLen: u32, valueLen: u32, timestamp: i64): i32 {
  sealed = true;
  record.key.set(inputPtr, <i32>keyLen);
  record.value.set(inputPtr + <usize>keyLen, <i32>valueLen);
  record.timestamp = timestamp;
  beginKeyedCall(framesAt(keyLen + valueLen), inputPtr + <usize>inputCap);
  op().process(record);
  endCall();
  afterCall();
  return 0;
}

/**
 * clink_process_batch (docs/abi.md, "Batch calls"): count records of distinct keys in one call,
 * each processed as clink_process would. Before each record the header's current word names it,
 * so that the host attributes its imports and a trap to it; after it, its descriptor's out_end
 * says where its output ends in the area. A record that fails traps, as in clink_process.
 */
export function clink_process_batch(count: u32): i32 {
  sealed = true;
  let limit = inputPtr + <usize>inputCap;
  for (let i: u32 = 0; i < count; i++) {
    store<u32>(inputPtr, i, 4);
    let d = inputPtr + 16 + (<usize>i << 5);
    let at = inputPtr + <usize>load<u32>(d);
    let kl = load<u32>(d, 4);
    let vl = load<u32>(d, 8);
    record.key.set(at, <i32>kl);
    record.value.set(at + <usize>kl, <i32>vl);
    record.timestamp = load<i64>(d, 16);
    beginKeyedCall(at + ((<usize>(kl + vl) + 7) & ~<usize>7), limit);
    op().process(record);
    store<u32>(d, areaUsed(), 24);
  }
  endCall();
  // The collector's cadence counts records, as it does for calls of their own.
  if (count > 1) callsSinceCollect += <i32>count - 1;
  afterCall();
  return 0;
}

export function clink_on_timer(keyLen: u32, timestamp: i64): i32 {
  sealed = true;
  beginKeyedCall(framesAt(keyLen), inputPtr + <usize>inputCap);
  op().onTimer(timerKey.set(inputPtr, <i32>keyLen), timestamp);
  endCall();
  afterCall();
  return 0;
}

/**
 * Runs fn for a timer whose key the host wrote to the input buffer, the way clink_on_timer
 * runs onTimer. For ptimer.ts (clink_on_processing_timer); not re-exported by exports.ts.
 */
export function keyedTimerCall(keyLen: u32, timestamp: i64, fn: (key: Bytes, timestamp: i64) => void): i32 {
  sealed = true;
  beginKeyedCall(framesAt(keyLen), inputPtr + <usize>inputCap);
  fn(timerKey.set(inputPtr, <i32>keyLen), timestamp);
  endCall();
  afterCall();
  return 0;
}

export function clink_open(): i32 {
  sealed = true;
  op().open();
  afterCall();
  return 0;
}

export function clink_close(): i32 {
  beginCloseCall();
  op().close();
  endCall();
  afterCall();
  return 0;
}

export function clink_manifest(): i64 {
  let m = manifest;
  if (!m) {
    op(); // traps with a message if nothing was registered
    sealed = true;
    m = new Buffer();
    m.append('{"abi":').appendInt(abi.ABI_VERSION).append(',"name":"').append(operatorName).append('","states":[');
    appendNames(m, stateNames);
    if (prefetchNames.length > 0) {
      m.append('],"prefetch":[');
      appendNames(m, prefetchNames);
    }
    m.append('],"endpoints":[');
    appendNames(m, endpointNames);
    m.append("]}");
    manifest = m;
  }
  return (<i64>m.ptr << 32) | <i64>m.length;
}

function appendNames(b: Buffer, names: Array<string>): void {
  for (let i = 0; i < names.length; i++) {
    if (i > 0) b.appendByte(0x2C);
    b.appendByte(0x22).append(unchecked(names[i])).appendByte(0x22);
  }
}

// ---- garbage collection ----
//
// With --runtime minimal (what the SDK's build uses) nothing is collected unless __collect is
// called, and it may only be called when no managed reference lives on the wasm stack alone.
// The end of an export call is such a point: the host is the caller and the SDK's own objects
// are reachable from globals. So the SDK collects there:
//
//   - right after any call during which linear memory grew: garbage is about to cost pages that
//     are never returned;
//   - otherwise every `interval` calls. The interval starts at COLLECT_MIN and doubles after
//     each periodic collection, up to a ceiling: COLLECT_MAX at first, and, once memory has
//     grown, half the number of calls it took to outgrow it (never below COLLECT_MIN).
//
// A collection costs ~0.6 us even when there is nothing to free (it marks and sweeps the SDK's
// own objects). An operator that allocates nothing per record (like the examples) never grows
// memory, so the interval climbs to COLLECT_MAX and collection costs ~0.15 ns per record. One
// that allocates settles at the largest interval that does not grow memory: with ~1.5 KB of
// garbage per record (guest-sdk/sdktest, TestASCollects) that is 1-2 pages per instance, and
// instance size is what bounds the number of suspended calls a host can afford.

const COLLECT_MIN: i32 = 32;
const COLLECT_MAX: i32 = 4096;
let interval: i32 = COLLECT_MIN;
let ceiling: i32 = COLLECT_MAX;
let callsSinceCollect: i32 = 0;
let pagesAtCollect: i32 = -1; // -1 until the first call ends: initialisation is not garbage

// The common case, nothing to do, is inlined into every export: a call costs more than the
// check in wazero's compiled code.
// @ts-ignore: decorator
@inline
function afterCall(): void {
  if (ASC_RUNTIME != 1) return; // stub: nothing to collect; incremental: collects by itself
  callsSinceCollect++;
  if (callsSinceCollect < interval && memory.size() == pagesAtCollect) return;
  maybeCollect();
}

function maybeCollect(): void {
  if (pagesAtCollect < 0) {
    callsSinceCollect = 0;
    pagesAtCollect = memory.size();
    return;
  }
  if (memory.size() != pagesAtCollect) {
    let safe = callsSinceCollect >> 1;
    ceiling = safe > COLLECT_MIN ? (safe < ceiling ? safe : ceiling) : COLLECT_MIN;
    interval = COLLECT_MIN;
  } else if (callsSinceCollect >= interval) {
    let next = interval << 1;
    interval = next < ceiling ? next : ceiling;
  } else {
    return;
  }
  __collect();
  callsSinceCollect = 0;
  pagesAtCollect = memory.size();
}

/** Growth of memory for the input buffer is not garbage: keep it out of afterCall's signal. */
function inputGrew(pagesBefore: i32): void {
  if (pagesAtCollect >= 0) pagesAtCollect += memory.size() - pagesBefore;
}

/** The input buffer's address (for the key function). */
export function inputBuffer(): usize {
  return inputPtr;
}
