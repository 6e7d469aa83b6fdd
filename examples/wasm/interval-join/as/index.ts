// A clink-wasm operator for an event-time interval join, FULL OUTER, with the rules of Flink's
// interval join (TimeIntervalJoin, and FLINK-41355's async-state version of it):
//
//   left l and right r join when they have the same join key and  l.ts - B <= r.ts <= l.ts + A.
//
// Both inputs arrive as one stream: each record says its side ("side":"L" or "R"), its join key
// ("id") and its time ("ts"). The pipeline keys records with this module's key function (the
// id), so the state below is per join key:
//
//   - each side's rows are buffered per key by row time: state left/right, one entry per row
//     time ("<ts>"), holding the rows at that time with a joined flag; left_times/right_times
//     hold the key's row times in order (the ABI reads entries by name and cannot list them);
//   - each side has one cleanup timer per key, its time kept in left_timer/right_timer (absent:
//     none). A row is cached until its side's cleanup time, ts + A for a left row and ts + B
//     for a right one: after that no row of the other side that is not late can match it;
//   - a record first joins with the other side's cached rows in its interval, then is cached if
//     the other side can still bring a match; a row that never joined is emitted null-padded
//     when it leaves the cache (or at once, if it is never cached);
//   - a row whose join key is null can never match: it is emitted padded at once, never cached;
//   - row times at or before zero are ordinary times (timer presence is its own state, never a
//     zero time), and cleanup times saturate at the end of time instead of overflowing;
//   - when a cleanup timer fires, every expired bucket of the side is padded and then removed
//     in one pass with one rewrite of the times index; when no row of the side survives, its
//     timer state and index are deleted, otherwise the timer is set for the earliest survivor.
//
// Output: {"key":ID,"left":ROW|null,"right":ROW|null}, ROW being the input record as it came.
// Late records (at or before the watermark) never reach the operator: the pipeline drops them
// or sends them to the side output join.late (docs/pipeline-spec.md, `late`).
import { Operator, Record, State, Buffer, Bytes, JsonValue, json, register, emit, registerTimer, watermark, setKeyFunction } from "../../../../guest-sdk/assemblyscript/assembly";
export * from "../../../../guest-sdk/assemblyscript/assembly/exports";
export { clink_key } from "../../../../guest-sdk/assemblyscript/assembly/keyfunc";

const A: i64 = 10_000; // a right row may come up to A ms after the left one
const B: i64 = 5_000; //  or up to B ms before it

const LEFT = 0, RIGHT = 1;
const rows = [new State("left"), new State("right")];
const times = [new State("left_times"), new State("right_times")];
const timers = [new State("left_timer"), new State("right_timer")];

const idView = new JsonValue();
const sideView = new JsonValue();
const idText = new Buffer(64);
const keyOut = new Buffer(64);

// The key function: the id's text (a string unquoted, other values as written); a null or
// missing id is the empty key (such rows are never cached, so they share nothing).
setKeyFunction((value: Bytes, key: Bytes): bool => {
  if (!json.field(value, "id", idView) || idView.isNull) {
    key.set(0, 0);
    return true;
  }
  if (idView.isString) {
    if (!idView.unquoteInto(keyOut.clear())) return false;
    key.set(keyOut.ptr, keyOut.length);
  } else {
    key.set(idView.ptr, idView.length);
  }
  return true;
});

function satAdd(t: i64, d: i64): i64 {
  return t > i64.MAX_VALUE - d ? i64.MAX_VALUE : t + d;
}

function satSub(t: i64, d: i64): i64 {
  return t < i64.MIN_VALUE + d ? i64.MIN_VALUE : t - d;
}

// cleanupTime is when a row of side s at time t leaves the cache.
function cleanupTime(s: i32, t: i64): i64 {
  return satAdd(t, s == LEFT ? A : B);
}

// ---- the times index: packed little-endian i64s, ascending, unique ----

const idx = [new Buffer(256), new Buffer(256)];

function loadTimes(s: i32): Buffer {
  let b = idx[s];
  if (!times[s].getInto("", b)) b.clear();
  return b;
}

function timeAt(b: Buffer, i: i32): i64 {
  return load<i64>(b.ptr + <usize>(i << 3));
}

// insertTime adds t to b if absent; reports whether it did.
function insertTime(b: Buffer, t: i64): bool {
  let n = b.length >> 3;
  let i = 0;
  while (i < n && timeAt(b, i) < t) i++;
  if (i < n && timeAt(b, i) == t) return false;
  b.reserve(8);
  let p = b.ptr + <usize>(i << 3);
  memory.copy(p + 8, p, <usize>((n - i) << 3));
  store<i64>(p, t);
  b.length += 8;
  return true;
}

// ---- buckets: per row time, [u8 joined][u32 length][row] ... ----

const bucket = new Buffer(512);
const entry = new Buffer(24);

function entryName(t: i64): Buffer {
  return entry.clear().appendInt(t);
}

const out = new Buffer(1024);
const padded = new Bytes();

function emitPair(key: Bytes, left: Bytes | null, right: Bytes | null): void {
  out.clear().append('{"key":');
  if (key.length == 0) out.append("null");
  else out.appendJsonString(key);
  out.append(',"left":');
  if (left) out.append(left);
  else out.append("null");
  out.append(',"right":');
  if (right) out.append(right);
  else out.append("null");
  out.appendByte(0x7D);
  emit(key, out);
}

function emitPadded(key: Bytes, s: i32, row: Bytes): void {
  if (s == LEFT) emitPair(key, row, null);
  else emitPair(key, null, row);
}

const rowView = new Bytes();

class IntervalJoin extends Operator {
  process(record: Record): void {
    let v = record.value;
    if (!json.field(v, "side", sideView)) throw new Error("record without a side");
    let s: i32;
    if (sideView.length == 3 && load<u8>(sideView.ptr + 1) == 0x4C) s = LEFT; // "L"
    else if (sideView.length == 3 && load<u8>(sideView.ptr + 1) == 0x52) s = RIGHT; // "R"
    else throw new Error("side must be \"L\" or \"R\"");
    let key = record.key;
    // A null join key never equals anything: nothing to join with, nothing to cache.
    if (!json.field(v, "id", idView) || idView.isNull) {
      emitPadded(key, s, v);
      return;
    }
    let t = record.timestamp;
    let o = 1 - s;
    // The other side's rows this one joins: o-times in [lo, hi].
    let lo = s == LEFT ? satSub(t, B) : satSub(t, A);
    let hi = s == LEFT ? satAdd(t, A) : satAdd(t, B);
    let joined = false;
    let ot = loadTimes(o);
    let n = ot.length >> 3;
    for (let i = 0; i < n; i++) {
      let u = timeAt(ot, i);
      if (u < lo) continue;
      if (u > hi) break;
      if (!rows[o].getInto(entryName(u), bucket)) continue;
      let changed = false;
      let p = 0;
      while (p < bucket.length) {
        let flag = bucket.ptr + <usize>p;
        let len = <i32>load<u32>(flag + 1);
        rowView.set(flag + 5, len);
        if (s == LEFT) emitPair(key, v, rowView);
        else emitPair(key, rowView, v);
        if (load<u8>(flag) == 0) {
          store<u8>(flag, 1);
          changed = true;
        }
        joined = true;
        p += 5 + len;
      }
      if (changed) rows[o].put(entryName(u), bucket);
    }
    // Cache the row while a row of the other side that is not late (> watermark) can still
    // fall in its interval: while hi > watermark.
    if (hi <= watermark()) {
      if (!joined) emitPadded(key, s, v);
      return;
    }
    if (!rows[s].getInto(entryName(t), bucket)) bucket.clear();
    bucket.appendByte(joined ? 1 : 0);
    bucket.reserve(4);
    store<u32>(bucket.ptr + <usize>bucket.length, <u32>v.length);
    bucket.length += 4;
    bucket.append(v);
    rows[s].put(entryName(t), bucket);
    let st = loadTimes(s);
    if (insertTime(st, t)) times[s].put("", st);
    if (!timers[s].has("")) {
      let at = cleanupTime(s, t);
      registerTimer(at);
      timers[s].putI64("", at);
    }
  }

  onTimer(key: Bytes, timestamp: i64): void {
    for (let s = 0; s < 2; s++) {
      if (!timers[s].has("") || timers[s].getI64("") != timestamp) continue;
      this.expire(key, s, watermark());
    }
  }

  // expire pads and removes side s's buckets whose cleanup time is at or before wm.
  expire(key: Bytes, s: i32, wm: i64): void {
    let st = loadTimes(s);
    let n = st.length >> 3;
    let k = 0; // st[0..k) expired
    while (k < n && cleanupTime(s, timeAt(st, k)) <= wm) {
      let u = timeAt(st, k);
      if (rows[s].getInto(entryName(u), bucket)) {
        let p = 0;
        while (p < bucket.length) {
          let flag = bucket.ptr + <usize>p;
          let len = <i32>load<u32>(flag + 1);
          if (load<u8>(flag) == 0) emitPadded(key, s, padded.set(flag + 5, len));
          p += 5 + len;
        }
      }
      k++;
    }
    // The bulk removal: every expired bucket, then one rewrite of the index (or its deletion
    // with the timer state when nothing survives).
    for (let i = 0; i < k; i++) rows[s].delete(entryName(timeAt(st, i)));
    if (k == n) {
      times[s].delete("");
      timers[s].delete("");
      return;
    }
    memory.copy(st.ptr, st.ptr + <usize>(k << 3), <usize>((n - k) << 3));
    st.length = (n - k) << 3;
    times[s].put("", st);
    let at = cleanupTime(s, timeAt(st, 0));
    registerTimer(at);
    timers[s].putI64("", at);
  }
}

register("interval_join", new IntervalJoin());
