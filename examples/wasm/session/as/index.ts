// A clink-wasm operator that groups each key's records into event-time sessions: a session is
// a maximal run of records less than GAP apart. Once the watermark passes a session's
// end it emits {"key":K,"start":S,"end":E,"count":N} (E = last record + GAP, exclusive) and
// forgets it. Records may arrive out of order: a record can start a session, extend one, or
// join two (Flink's merging session windows). Build: see ../../README.md.
import { Operator, Record, State, Buffer, Bytes, register, emit, registerTimer, deleteTimer } from "../../../../guest-sdk/assemblyscript/assembly";
export * from "../../../../guest-sdk/assemblyscript/assembly/exports";

const GAP: i64 = 30_000; // ms

// Per key, the open sessions as packed little-endian i64 triples (start, end, count), sorted
// by start and pairwise disjoint. Sessions merge when they overlap, not when they only touch
// (a record exactly GAP after the last starts a new session): a session closed by its timer
// can then never have been extended by a record that was not late. One value per key: the
// ABI reads entries by name and cannot list them.
const sessions = new State("sessions");
const cur = new Buffer(256);
const next = new Buffer(256);
const out = new Buffer(128);

// The timer that closes [start, end) fires when the watermark reaches end - 1: no record at
// or before it can arrive any more, so none can extend the session. end saturates at the end
// of time instead of overflowing.
function endOf(ts: i64): i64 {
  return ts > i64.MAX_VALUE - GAP ? i64.MAX_VALUE : ts + GAP;
}

// @ts-ignore: decorator
@inline
function at(b: Buffer, i: i32, f: i32): i64 {
  return load<i64>(b.ptr + <usize>(i * 24 + f * 8));
}

function push(b: Buffer, start: i64, end: i64, count: i64): void {
  b.reserve(24);
  let p = b.ptr + <usize>b.length;
  store<i64>(p, start);
  store<i64>(p + 8, end);
  store<i64>(p + 16, count);
  b.length += 24;
}

function save(b: Buffer): void {
  if (b.length == 0) sessions.delete("");
  else sessions.put("", b);
}

class Sessions extends Operator {
  process(record: Record): void {
    let ts = record.timestamp;
    let start = ts, end = endOf(ts), count: i64 = 1;
    if (!sessions.getInto("", cur)) cur.clear();
    next.clear();
    let n = cur.length / 24;
    let placed = false;
    for (let i = 0; i < n; i++) {
      let s = at(cur, i, 0), e = at(cur, i, 1), c = at(cur, i, 2);
      if (s < end && e > start) {
        // Overlaps the new record's window: merge it in; its timer is replaced.
        if (s < start) start = s;
        if (e > end) end = e;
        count += c;
        deleteTimer(e - 1);
        continue;
      }
      if (!placed && s >= end) {
        push(next, start, end, count);
        placed = true;
      }
      push(next, s, e, c);
    }
    if (!placed) push(next, start, end, count);
    // A merged-away session's end can equal the merged one's: register after the deletes.
    registerTimer(end - 1);
    save(next);
  }

  onTimer(key: Bytes, timestamp: i64): void {
    if (!sessions.getInto("", cur)) return;
    next.clear();
    let n = cur.length / 24;
    for (let i = 0; i < n; i++) {
      let s = at(cur, i, 0), e = at(cur, i, 1), c = at(cur, i, 2);
      if (e - 1 != timestamp) {
        push(next, s, e, c);
        continue;
      }
      out.clear().append('{"key":').appendJsonString(key).append(',"start":').appendInt(s);
      out.append(',"end":').appendInt(e).append(',"count":').appendInt(c).appendByte(0x7D);
      emit(key, out);
    }
    save(next);
  }
}

register("session", new Sessions());
