// A small allocation-free JSON toolkit: find a field of an object, test and parse integers.
// It behaves exactly like the Go SDK's jsonx package (same field lookup, same integer
// grammar), and Buffer.appendJsonString / Buffer.appendInt produce the same bytes as
// jsonx.AppendString / jsonx.AppendInt, so operators in both languages can match byte for byte.

import { Bytes, Buffer } from "./bytes";

/** A view of one raw JSON value (for a string, quotes included). */
export class JsonValue extends Bytes {
  /** Whether the value is a JSON string. */
  get isString(): bool {
    return this.length >= 2 && load<u8>(this.ptr) == 0x22;
  }

  /** Whether the value is null. */
  get isNull(): bool {
    return this.length == 4 && load<u32>(this.ptr) == 0x6C6C756E; // "null"
  }

  /**
   * Whether the value is a JSON integer, -?(0|[1-9][0-9]*), within i64. A fraction, an
   * exponent, a leading '+' or zero, or a value out of range is not.
   */
  get isInt(): bool {
    parseInt(this.ptr, this.length, false);
    return intOk;
  }

  /** The integer value; traps if isInt is false. */
  toInt(): i64 {
    return parseInt(this.ptr, this.length, true);
  }

  /**
   * Appends the text of this JSON string, escapes decoded, to out. Returns false if the value
   * is not a well-formed JSON string. A \u escape of a lone surrogate decodes to U+FFFD; bytes
   * that are not valid UTF-8 are copied as they are (the Go SDK's jsonx.AppendUnquote).
   */
  unquoteInto(out: Buffer): bool {
    return unquote(this.ptr, this.length, out);
  }
}

function hex4(p: usize, n: i32, i: i32): i32 {
  if (i + 4 > n) return -1;
  let r = 0;
  for (let j = i; j < i + 4; j++) {
    let c = <i32>load<u8>(p + <usize>j);
    if (c >= 0x30 && c <= 0x39) c -= 0x30;
    else if (c >= 0x61 && c <= 0x66) c -= 0x57;
    else if (c >= 0x41 && c <= 0x46) c -= 0x37;
    else return -1;
    r = (r << 4) | c;
  }
  return r;
}

function appendRune(out: Buffer, r: u32): void {
  if (r < 0x80) {
    out.appendByte(<u8>r);
  } else if (r < 0x800) {
    out.appendByte(<u8>(0xC0 | (r >> 6))).appendByte(<u8>(0x80 | (r & 0x3F)));
  } else if (r < 0x10000) {
    out.appendByte(<u8>(0xE0 | (r >> 12))).appendByte(<u8>(0x80 | ((r >> 6) & 0x3F))).appendByte(<u8>(0x80 | (r & 0x3F)));
  } else {
    out.appendByte(<u8>(0xF0 | (r >> 18))).appendByte(<u8>(0x80 | ((r >> 12) & 0x3F)));
    out.appendByte(<u8>(0x80 | ((r >> 6) & 0x3F))).appendByte(<u8>(0x80 | (r & 0x3F)));
  }
}

function unquote(raw: usize, rawLen: i32, out: Buffer): bool {
  if (rawLen < 2 || load<u8>(raw) != 0x22 || load<u8>(raw + <usize>(rawLen - 1)) != 0x22) return false;
  let p = raw + 1;
  let n = rawLen - 2;
  for (let i = 0; i < n; i++) {
    let c = load<u8>(p + <usize>i);
    if (c == 0x22 || c < 0x20) return false;
    if (c != 0x5C) {
      out.appendByte(c);
      continue;
    }
    i++;
    if (i == n) return false;
    c = load<u8>(p + <usize>i);
    if (c == 0x22 || c == 0x5C || c == 0x2F) out.appendByte(c);
    else if (c == 0x62) out.appendByte(0x08);
    else if (c == 0x66) out.appendByte(0x0C);
    else if (c == 0x6E) out.appendByte(0x0A);
    else if (c == 0x72) out.appendByte(0x0D);
    else if (c == 0x74) out.appendByte(0x09);
    else if (c == 0x75) {
      let r = hex4(p, n, i + 1);
      if (r < 0) return false;
      i += 4;
      if (r >= 0xD800 && r < 0xDC00) {
        // A high surrogate: combine with a following \uDC00-\uDFFF escape.
        let r2 = -1;
        if (i + 6 < n && load<u8>(p + <usize>(i + 1)) == 0x5C && load<u8>(p + <usize>(i + 2)) == 0x75) r2 = hex4(p, n, i + 3);
        if (r2 >= 0xDC00 && r2 < 0xE000) {
          r = 0x10000 + ((r - 0xD800) << 10) + (r2 - 0xDC00);
          i += 6;
        } else {
          r = 0xFFFD;
        }
      } else if (r >= 0xDC00 && r < 0xE000) {
        r = 0xFFFD;
      }
      appendRune(out, <u32>r);
    } else {
      return false;
    }
  }
  return true;
}

let intOk = false;

function parseInt(p: usize, n: i32, strict: bool): i64 {
  intOk = false;
  let i = 0;
  let neg = false;
  if (n > 0 && load<u8>(p) == 0x2D) {
    neg = true;
    i = 1;
  }
  if (i >= n || (load<u8>(p + <usize>i) == 0x30 && n > i + 1)) return fail(strict);
  // Accumulate as a negative number: its range includes i64.MIN_VALUE.
  const min: i64 = i64.MIN_VALUE;
  let v: i64 = 0;
  for (; i < n; i++) {
    let c = load<u8>(p + <usize>i);
    if (c < 0x30 || c > 0x39) return fail(strict);
    let d = <i64>(c - 0x30);
    if (v < (min + d) / 10) return fail(strict);
    v = v * 10 - d;
  }
  if (!neg) {
    if (v == min) return fail(strict);
    v = -v;
  }
  intOk = true;
  return v;
}

function fail(strict: bool): i64 {
  if (strict) throw new Error("JSON value is not an integer within i64");
  return 0;
}

// @ts-ignore: decorator
@inline
function isSpace(c: u8): bool {
  return c == 0x20 || c == 0x09 || c == 0x0A || c == 0x0D;
}

function skipSpace(p: usize, n: i32, i: i32): i32 {
  while (i < n && isSpace(load<u8>(p + <usize>i))) i++;
  return i;
}

/** Index just past the string starting at i (a quote), or -1. */
function skipString(p: usize, n: i32, i: i32): i32 {
  for (i++; i < n; i++) {
    let c = load<u8>(p + <usize>i);
    if (c == 0x5C) i++;
    else if (c == 0x22) return i + 1;
  }
  return -1;
}

/** Index just past the value starting at i, or -1 if malformed (scalars are delimited, not validated). */
function skipValue(p: usize, n: i32, i: i32): i32 {
  if (i >= n) return -1;
  let c = load<u8>(p + <usize>i);
  if (c == 0x22) return skipString(p, n, i);
  if (c == 0x7B || c == 0x5B) {
    let depth = 0;
    while (i < n) {
      c = load<u8>(p + <usize>i);
      if (c == 0x22) {
        i = skipString(p, n, i);
        if (i < 0) return -1;
        continue;
      }
      if (c == 0x7B || c == 0x5B) depth++;
      else if (c == 0x7D || c == 0x5D) {
        depth--;
        if (depth == 0) return i + 1;
      }
      i++;
    }
    return -1;
  }
  if (c == 0x2C || c == 0x3A || c == 0x7D || c == 0x5D) return -1;
  let start = i;
  while (i < n) {
    c = load<u8>(p + <usize>i);
    if (isSpace(c) || c == 0x2C || c == 0x7D || c == 0x5D) break;
    i++;
  }
  return i == start ? -1 : i;
}

const nameBuf = new Buffer(64);

/**
 * Finds the first field called name in the top-level object obj and points out at its raw
 * value. Returns false if obj is not an object, is malformed before the field, or has no such
 * field. Names are compared with their raw JSON text (a name written with escapes is not
 * matched). out (a JsonValue, or any Bytes) points into obj.
 */
export function field(obj: Bytes, name: string, out: Bytes): bool {
  let p = obj.ptr;
  let n = obj.length;
  let nb = nameBuf.clear().append(name);
  let i = skipSpace(p, n, 0);
  if (i >= n || load<u8>(p + <usize>i) != 0x7B) return false;
  i++;
  while (true) {
    i = skipSpace(p, n, i);
    if (i >= n) return false;
    let c = load<u8>(p + <usize>i);
    if (c != 0x22) return false; // '}' (no such field) or malformed
    let end = skipString(p, n, i);
    if (end < 0) return false;
    let klen = end - 1 - (i + 1);
    let match = klen == nb.length && memory.compare(p + <usize>(i + 1), nb.ptr, <usize>klen) == 0;
    i = skipSpace(p, n, end);
    if (i >= n || load<u8>(p + <usize>i) != 0x3A) return false;
    i = skipSpace(p, n, i + 1);
    let vend = skipValue(p, n, i);
    if (vend < 0) return false;
    if (match) {
      out.set(p + <usize>i, vend - i);
      return true;
    }
    i = skipSpace(p, n, vend);
    if (i >= n || load<u8>(p + <usize>i) != 0x2C) return false;
    i++;
  }
}
