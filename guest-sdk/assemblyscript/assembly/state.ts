// Keyed state (docs/abi.md, "get_async", "put", "delete", "take_result").

import * as abi from "./abi";
import { Bytes, Buffer, view, isEmptyArg, copyBytes, keyScratch, valueScratch } from "./bytes";
import { declareState } from "./operator";
import { Frame, declarePrefetch, keyedCall } from "./fastpath";

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

/** Options of a State, given as an object literal: `new State("count", { prefetch: true })`. */
export class StateOptions {
  /**
   * Prefetch the per-key value (the "" entry): the host delivers it with every record and
   * timer and takes it back written, so a read-modify-write makes no import call. At most 16
   * states per module; prefetch only what most records read.
   */
  prefetch: bool = false;
}

/**
 * A named keyed state: a map from entry (state key) to value, one map per record key. Inside a
 * call for record key K, every method reads or writes K's map only. Use the empty entry ("")
 * for a plain per-key value, or distinct entries for a per-key map.
 *
 * Declare states at the top level of a file, so they exist before the manifest is produced:
 *
 *     const seen = new State("seen");
 *     const counts = new State("count", { prefetch: true });
 *
 * Entries and values may be strings (UTF-8 encoded), Bytes, Buffers, ArrayBuffers,
 * Uint8Arrays or StaticArray<u8>s. Methods are allowed in process and onTimer only.
 *
 * A prefetched state's "" entry is read from and written to a frame the host delivers with
 * the record (docs/abi.md, "Prefetched values"): no import call. A value larger than the frame
 * goes through the put import; reads in the same call then go through get_async until the
 * entry is written again, so a call always reads what it wrote. Other entries use the imports.
 */
export class State {
  readonly name: string;
  readonly index: u32;
  /** The state's frame when it is prefetched, null otherwise. */
  private frame: Frame | null = null;

  /** Declares a state (1-128 characters of [A-Za-z0-9_.-], unique in the module). */
  constructor(name: string, options: StateOptions | null = null) {
    this.name = name;
    this.index = declareState(name);
    if (options !== null && options.prefetch) this.frame = declarePrefetch(name);
  }

  /** Whether the state was declared with { prefetch: true }. */
  get prefetched(): bool {
    return this.frame !== null;
  }

  // The frame serves entry "" of a prefetched state during process and onTimer: for writing
  // always, for reading unless a value too large for it went through put (stale). The checks
  // come before any view of the entry is made, so the frame path touches nothing else.

  /** The frame's header address when the frame serves reads of entry, else 0. */
  // @ts-ignore: decorator
  @inline
  private readFrame<E>(entry: E): usize {
    let f = this.frame;
    if (f === null || !keyedCall || f.stale || !isEmptyArg<E>(entry)) return 0;
    return f.ptr;
  }

  /** The frame's header address when the frame serves writes of entry, else 0. */
  // @ts-ignore: decorator
  @inline
  private writeFrame<E>(entry: E): usize {
    let f = this.frame;
    if (f === null || !keyedCall || !isEmptyArg<E>(entry)) return 0;
    return f.ptr;
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
    let fp = this.readFrame<E>(entry);
    if (fp != 0) return load<u32>(fp) != abi.Frame.ABSENT;
    let e = view<E>(entry, entryView, keyScratch);
    let n = abi.get_async(this.index, e.ptr, <u32>e.length, 0, 0);
    if (n == abi.Code.NOT_FOUND) return false;
    this.check(n, "get");
    return true;
  }

  /** Reads an entry written by putI64 (8 bytes, little-endian), or fallback when absent. */
  getI64<E>(entry: E, fallback: i64 = 0): i64 {
    let fp = this.readFrame<E>(entry);
    let n: i32, p: usize;
    if (fp != 0) {
      // Decoded in the frame: no copy.
      let len = load<u32>(fp);
      if (len == abi.Frame.ABSENT) return fallback;
      n = <i32>len;
      p = fp + <usize>abi.Frame.HEADER;
    } else {
      n = this.readImport(view<E>(entry, entryView, keyScratch), i64Cell);
      if (n < 0) return fallback;
      p = i64Cell.ptr;
    }
    if (n != 8) throw new Error("state " + this.name + ": getI64 of a " + n.toString() + "-byte value");
    return load<i64>(p);
  }

  /** Sets entry to a copy of value. An empty value is a value, not a delete. Returns 0 or a negative Code. */
  put<E, V>(entry: E, value: V): i32 {
    let fp = this.writeFrame<E>(entry);
    let v = view<V>(value, valueView, valueScratch);
    if (fp != 0) return this.putFrame(fp, v.ptr, <u32>v.length);
    let e = view<E>(entry, entryView, keyScratch);
    return abi.put(this.index, e.ptr, <u32>e.length, v.ptr, <u32>v.length);
  }

  /** Writes v as 8 bytes, little-endian (the layout of the Go SDK's PutInt64). */
  putI64<E>(entry: E, v: i64): i32 {
    let fp = this.writeFrame<E>(entry);
    if (fp != 0) {
      // A frame holds at least 64 bytes.
      store<i64>(fp + <usize>abi.Frame.HEADER, v);
      this.markFrame(fp, 8);
      return 0;
    }
    let e = view<E>(entry, entryView, keyScratch);
    store<i64>(i64Cell.ptr, v);
    return abi.put(this.index, e.ptr, <u32>e.length, i64Cell.ptr, 8);
  }

  /** Removes entry; removing an absent entry succeeds. Returns 0 or a negative Code. */
  delete<E>(entry: E): i32 {
    let fp = this.writeFrame<E>(entry);
    if (fp != 0) {
      this.markFrame(fp, abi.Frame.ABSENT);
      return 0;
    }
    let e = view<E>(entry, entryView, keyScratch);
    return abi.del(this.index, e.ptr, <u32>e.length);
  }

  /** Writes a value to the frame at fp if it fits, and otherwise with the put import. */
  private putFrame(fp: usize, vp: usize, vl: u32): i32 {
    if (vl <= load<u32>(fp, 4)) {
      copyBytes(fp + <usize>abi.Frame.HEADER, vp, <usize>vl);
      this.markFrame(fp, vl);
      return 0;
    }
    // Too large for the frame: docs/abi.md says put, and the frame must then stay un-DIRTY or
    // the write-back would overwrite the put. A failed put changes nothing.
    let rc = abi.put(this.index, 0, 0, vp, vl);
    if (rc < 0) return rc;
    store<u32>(fp, load<u32>(fp, 8) & ~abi.Frame.DIRTY, 8);
    changetype<Frame>(this.frame).stale = true;
    return 0;
  }

  /** Sets the frame's len (ABSENT deletes) and marks it DIRTY. */
  // @ts-ignore: decorator
  @inline
  private markFrame(fp: usize, len: u32): void {
    store<u32>(fp, len);
    store<u32>(fp, load<u32>(fp, 8) | abi.Frame.DIRTY, 8);
    changetype<Frame>(this.frame).stale = false;
  }

  /** Reads entry into out (replacing its contents); -1 when absent. */
  private readInto<E>(entry: E, out: Buffer): i32 {
    let fp = this.readFrame<E>(entry);
    if (fp != 0) {
      let len = load<u32>(fp);
      if (len == abi.Frame.ABSENT) {
        out.length = 0;
        return -1;
      }
      out.clear().appendRaw(fp + <usize>abi.Frame.HEADER, <i32>len);
      return <i32>len;
    }
    return this.readImport(view<E>(entry, entryView, keyScratch), out);
  }

  /** Reads entry e into out (replacing its contents) with get_async; -1 when absent. */
  private readImport(e: Bytes, out: Buffer): i32 {
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
