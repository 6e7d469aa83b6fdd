// A clink-wasm operator that counts records per key in tumbling event-time windows of one
// minute, and emits {"key":K,"window_start":W,"count":N} once per key and window, when the
// watermark passes the window's end (an event-time timer). Build: see ../README.md.
import { Operator, Record, State, Buffer, Bytes, register, emit, registerTimer } from "../../../../guest-sdk/assemblyscript/assembly";
export * from "../../../../guest-sdk/assemblyscript/assembly/exports";

const SIZE: i64 = 60_000; // window size, ms

// Per record key, one int64 count per open window, under the entry "<window start>".
const counts = new State("window_count");
const out = new Buffer(96);

// windowStart is floor(ts / SIZE) * SIZE, also for negative timestamps.
function windowStart(ts: i64): i64 {
  let q = ts / SIZE;
  if (ts % SIZE < 0) q -= 1;
  return q * SIZE;
}

class Tumbling extends Operator {
  process(record: Record): void {
    let w = windowStart(record.timestamp);
    let entry = w.toString();
    counts.putI64(entry, counts.getI64(entry) + 1);
    // The window [w, w+SIZE) is complete once the watermark reaches w+SIZE-1; a window at the
    // end of time saturates instead of overflowing.
    let end = w > i64.MAX_VALUE - SIZE ? i64.MAX_VALUE : w + SIZE - 1;
    registerTimer(end);
  }

  onTimer(key: Bytes, timestamp: i64): void {
    let w = timestamp == i64.MAX_VALUE ? windowStart(timestamp) : timestamp - (SIZE - 1);
    let entry = w.toString();
    let n = counts.getI64(entry);
    if (n == 0) return;
    counts.delete(entry);
    out.clear().append('{"key":').appendJsonString(key).append(',"window_start":').appendInt(w);
    out.append(',"count":').appendInt(n).appendByte(0x7D);
    emit(key, out);
  }
}

register("tumbling", new Tumbling());
