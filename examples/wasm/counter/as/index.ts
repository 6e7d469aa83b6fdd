// A clink-wasm operator that counts records per key and emits {"key":K,"count":N} for every
// record. Build: see ../README.md.
import { Operator, Record, State, Buffer, register, emit } from "../../../../guest-sdk/assemblyscript/assembly";
export * from "../../../../guest-sdk/assemblyscript/assembly/exports";

// One int64 per record key, under the empty entry. Prefetched: the host delivers it with each
// record and takes it back written, so the read-modify-write makes no import call.
const counts = new State("count", { prefetch: true });
// The output buffer, reused for every record.
const out = new Buffer(64);

class Counter extends Operator {
  process(record: Record): void {
    let n = counts.getI64("") + 1;
    counts.putI64("", n);
    out.clear().append('{"key":').appendJsonString(record.key).append(',"count":').appendInt(n).appendByte(0x7D);
    emit(record.key, out);
  }
}

register("counter", new Counter());
