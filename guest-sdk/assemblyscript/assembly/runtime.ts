// Replacements for the host functions AssemblyScript's standard library imports from "env"
// (abort, trace, seed). The build points them here with
//   --use abort=<this file>/clinkAbort --use trace=<this file>/clinkTrace --use seed=<this file>/clinkSeed
// so that a module imports nothing but clink_v1 (the host refuses any other import module).

import * as abi from "./abi";

// A static buffer for the abort message: abort may be running because the heap is exhausted,
// so it must not allocate. (No mutable globals either: abort can run while globals are still
// being initialised, so positions are passed around.)
const ABORT_CAP: i32 = 2048;
const abortBuf = memory.data(ABORT_CAP);

function putByte(pos: i32, c: u32): i32 {
  if (pos >= ABORT_CAP) return pos;
  store<u8>(abortBuf + <usize>pos, <u8>c);
  return pos + 1;
}

function putString(pos: i32, s: string): i32 {
  let n = s.length;
  for (let i = 0; i < n; i++) {
    let c = <u32>s.charCodeAt(i);
    if (c >= 0xD800 && c < 0xDC00 && i + 1 < n) {
      let d = <u32>s.charCodeAt(i + 1);
      if (d >= 0xDC00 && d < 0xE000) {
        c = 0x10000 + ((c - 0xD800) << 10) + (d - 0xDC00);
        i++;
      }
    }
    if (c < 0x80) {
      pos = putByte(pos, c);
    } else if (c < 0x800) {
      pos = putByte(pos, 0xC0 | (c >> 6));
      pos = putByte(pos, 0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      pos = putByte(pos, 0xE0 | (c >> 12));
      pos = putByte(pos, 0x80 | ((c >> 6) & 0x3F));
      pos = putByte(pos, 0x80 | (c & 0x3F));
    } else {
      pos = putByte(pos, 0xF0 | (c >> 18));
      pos = putByte(pos, 0x80 | ((c >> 12) & 0x3F));
      pos = putByte(pos, 0x80 | ((c >> 6) & 0x3F));
      pos = putByte(pos, 0x80 | (c & 0x3F));
    }
  }
  return pos;
}

function putUint(pos: i32, v: u32): i32 {
  if (v >= 10) pos = putUint(pos, v / 10);
  return putByte(pos, 0x30 + v % 10);
}

/**
 * abort: `throw`, a failed assert, an out-of-range index... Logs "message (file:line:col)" at
 * error level, so the host attaches it to the fault report, then traps. The host discards the
 * instance (docs/abi.md, "Faults").
 */
export function clinkAbort(message: string | null, fileName: string | null, line: u32, column: u32): void {
  let pos = putString(0, message !== null ? changetype<string>(message) : "abort");
  if (fileName !== null) {
    pos = putString(pos, " (");
    pos = putString(pos, changetype<string>(fileName));
    pos = putByte(pos, 0x3A);
    pos = putUint(pos, line);
    pos = putByte(pos, 0x3A);
    pos = putUint(pos, column);
    pos = putByte(pos, 0x29);
  }
  abi.log(3, abortBuf, <u32>pos);
  unreachable();
}

/** trace: logs the message and the numbers at debug level. */
export function clinkTrace(message: string, n: i32 = 0, a0: f64 = 0, a1: f64 = 0, a2: f64 = 0, a3: f64 = 0, a4: f64 = 0): void {
  let s = message;
  if (n > 0) s += " " + a0.toString();
  if (n > 1) s += ", " + a1.toString();
  if (n > 2) s += ", " + a2.toString();
  if (n > 3) s += ", " + a3.toString();
  if (n > 4) s += ", " + a4.toString();
  let b = String.UTF8.encode(s);
  abi.log(0, changetype<usize>(b), <u32>b.byteLength);
}

/** seed for Math.random: the processing time (random enough for sampling, not for secrets). */
export function clinkSeed(): f64 {
  return <f64>abi.processing_time();
}
