// A clink-wasm operator that keeps a running count, sum, min and max of the integer field
// "value" per key and emits {"key":K,"count":N,"sum":S,"min":MIN,"max":MAX} for every record it
// aggregates. A record whose "value" is missing or not a JSON integer within i64 is skipped
// with a warning; a sum that would overflow i64 fails the record. Build: see ../README.md.
import { Operator, Record, State, Buffer, JsonValue, register, emit, json, log } from "../../../../guest-sdk/assemblyscript/assembly";
export * from "../../../../guest-sdk/assemblyscript/assembly/exports";

// Per record key: count, sum, min and max as four little-endian i64s. Prefetched: delivered
// with each record and written back by the host, with no import call.
const aggs = new State("agg", { prefetch: true });
const agg = new Buffer(32);
const value = new JsonValue();
const out = new Buffer(128);

class Aggregate extends Operator {
  process(record: Record): void {
    if (!json.field(record.value, "value", value) || !value.isInt) {
      log.warn('skipping a record whose "value" is not an integer');
      return;
    }
    let v = value.toInt();
    let count: i64, sum: i64, lo: i64, hi: i64;
    if (!aggs.getInto("", agg)) {
      count = 1;
      sum = lo = hi = v;
    } else {
      if (agg.length != 32) throw new Error("aggregate: corrupt state (want 32 bytes)");
      count = load<i64>(agg.ptr) + 1;
      sum = load<i64>(agg.ptr, 8);
      lo = min(load<i64>(agg.ptr, 16), v);
      hi = max(load<i64>(agg.ptr, 24), v);
      if ((v > 0 && sum > i64.MAX_VALUE - v) || (v < 0 && sum < i64.MIN_VALUE - v)) {
        throw new Error("aggregate: sum overflows int64");
      }
      sum += v;
    }
    agg.clear().reserve(32);
    store<i64>(agg.ptr, count);
    store<i64>(agg.ptr, sum, 8);
    store<i64>(agg.ptr, lo, 16);
    store<i64>(agg.ptr, hi, 24);
    agg.length = 32;
    aggs.put("", agg);

    out.clear().append('{"key":').appendJsonString(record.key);
    out.append(',"count":').appendInt(count).append(',"sum":').appendInt(sum);
    out.append(',"min":').appendInt(lo).append(',"max":').appendInt(hi).appendByte(0x7D);
    emit(record.key, out);
  }
}

register("aggregate", new Aggregate());
