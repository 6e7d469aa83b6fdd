// Keyed state (docs/abi.md, "get_async", "put", "delete", "take_result").

import * as abi from "./abi";
import { Bytes, Buffer, view, keyScratch, valueScratch } from "./bytes";
import { declareState } from "./operator";

/** The SDK's result buffer, shared by State.get and Endpoint.lookup. */
export const result = new Buffer(512);
const resultView = new Bytes();
const entryView = new Bytes();
const valueView = new Bytes();
const i64Cell = new Buffer(8);

/**
 * Reads into `result` (replacing its contents) with fetch(bufPtr, bufCap) and, when the
 * value did not fit, takes the pending result after growing the buffer. Returns the value's
 * length, or the negative code.
 */
export function fetchInto(out: Buffer, n: i32): i32 {
  if (n <= out.capacity) {
    out.length = n;
    return n;
  }
  out.clear().reserve(n);
  let rc = abi.take_result(out.ptr, <u32>out.capacity);
  if (rc >= 0) out.length = rc;
  return rc;
}

/**
 * A named keyed state: a map from entry (state key) to value, one map per record key. Inside a
 * call for record key K, every method reads or writes K's map only. Use the empty entry ("")
 * for a plain per-key value, or distinct entries for a per-key map.
 *
 * Declare states at the top level of a file, so they exist before the manifest is produced:
 *
 *     const seen = new State("seen");
 *
 * Entries and values may be strings (UTF-8 encoded), Bytes, Buffers, ArrayBuffers,
 * Uint8Arrays or StaticArray<u8>s. Methods are allowed in process and onTimer only.
 */
export class State {
  readonly name: string;
  readonly index: u32;

  /** Declares a state (1-128 characters of [A-Za-z0-9_.-], unique in the module). */
  constructor(name: string) {
    this.name = name;
    this.index = declareState(name);
  }

  /**
   * Reads entry. Returns null when it is absent, otherwise a view of the SDK's result buffer,
   * valid until the next get or lookup. Traps on an ABI error (no key context, entry too large).
   * May suspend while the host loads a cold value; the operator does not see it.
   */
  get<E>(entry: E): Bytes | null {
    let n = this.readInto<E>(entry, result);
    if (n < 0) return null;
    return resultView.set(result.ptr, n);
  }

  /** Reads entry into out (replacing its contents). Returns false when it is absent. */
  getInto<E>(entry: E, out: Buffer): bool {
    return this.readInto<E>(entry, out) >= 0;
  }

  /** Whether entry exists (reads no value bytes into guest memory). */
  has<E>(entry: E): bool {
    let e = view<E>(entry, entryView, keyScratch);
    let n = abi.get_async(this.index, e.ptr, <u32>e.length, 0, 0);
    if (n == abi.Code.NOT_FOUND) return false;
    this.check(n, "get");
    return true;
  }

  /** Reads an entry written by putI64 (8 bytes, little-endian), or fallback when absent. */
  getI64<E>(entry: E, fallback: i64 = 0): i64 {
    let n = this.readInto<E>(entry, i64Cell);
    if (n < 0) return fallback;
    if (n != 8) throw new Error("state " + this.name + ": getI64 of a " + n.toString() + "-byte value");
    return load<i64>(i64Cell.ptr);
  }

  /** Sets entry to a copy of value. An empty value is a value, not a delete. Returns 0 or a negative Code. */
  put<E, V>(entry: E, value: V): i32 {
    let e = view<E>(entry, entryView, keyScratch);
    let v = view<V>(value, valueView, valueScratch);
    return abi.put(this.index, e.ptr, <u32>e.length, v.ptr, <u32>v.length);
  }

  /** Writes v as 8 bytes, little-endian (the layout of the Go SDK's PutInt64). */
  putI64<E>(entry: E, v: i64): i32 {
    let e = view<E>(entry, entryView, keyScratch);
    store<i64>(i64Cell.ptr, v);
    return abi.put(this.index, e.ptr, <u32>e.length, i64Cell.ptr, 8);
  }

  /** Removes entry; removing an absent entry succeeds. Returns 0 or a negative Code. */
  delete<E>(entry: E): i32 {
    let e = view<E>(entry, entryView, keyScratch);
    return abi.del(this.index, e.ptr, <u32>e.length);
  }

  private readInto<E>(entry: E, out: Buffer): i32 {
    let e = view<E>(entry, entryView, keyScratch);
    let n = abi.get_async(this.index, e.ptr, <u32>e.length, out.ptr, <u32>out.capacity);
    if (n == abi.Code.NOT_FOUND) {
      out.length = 0;
      return -1;
    }
    this.check(n, "get");
    return this.check(fetchInto(out, n), "get");
  }

  private check(rc: i32, op: string): i32 {
    if (rc < 0) throw new Error("state " + this.name + ": " + op + ": " + abi.Code.name(rc));
    return rc;
  }
}
