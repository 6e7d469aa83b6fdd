// A clink-wasm operator with processing-time timers: it counts each key's records and emits
// {"key":K,"count":N} once the key has had no record for IDLE ms of processing time (the
// host's clock, not event time). Each record moves the key's timer: it deletes the timer the
// previous record set and registers one at processing_time() + IDLE. Build: see ../../README.md.
import { Operator, Record, State, Buffer, Bytes, register, emit, processingTime, registerProcessingTimer, deleteProcessingTimer } from "../../../../guest-sdk/assemblyscript/assembly";
export * from "../../../../guest-sdk/assemblyscript/assembly/exports";
export { clink_on_processing_timer } from "../../../../guest-sdk/assemblyscript/assembly/ptimer";
import { setProcessingTimerHandler } from "../../../../guest-sdk/assemblyscript/assembly/ptimer";

const IDLE: i64 = 5_000; // ms

// Per key: the count (entry "") and the time of the key's pending timer (entry "t").
const counts = new State("idle_count");
const out = new Buffer(96);

class Idle extends Operator {
  process(record: Record): void {
    counts.putI64("", counts.getI64("") + 1);
    if (counts.has("t")) deleteProcessingTimer(counts.getI64("t"));
    let at = processingTime() + IDLE;
    registerProcessingTimer(at);
    counts.putI64("t", at);
  }
}

// The key has been idle for IDLE ms: flush its count and forget it.
setProcessingTimerHandler((key: Bytes, timestamp: i64): void => {
  let n = counts.getI64("");
  counts.delete("");
  counts.delete("t");
  out.clear().append('{"key":').appendJsonString(key).append(',"count":').appendInt(n).appendByte(0x7D);
  emit(key, out);
});

register("idle", new Idle());
