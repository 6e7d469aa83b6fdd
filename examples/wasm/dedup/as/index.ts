// A clink-wasm operator that emits the first record of every key unchanged and drops the later
// ones. Build: see ../README.md.
import { Operator, Record, State, register, emit } from "../../../../guest-sdk/assemblyscript/assembly";
export * from "../../../../guest-sdk/assemblyscript/assembly/exports";

// An empty value for every key already emitted. Prefetched: the host delivers it with each
// record, so checking and marking a key makes no import call.
const seen = new State("seen", { prefetch: true });

class Dedup extends Operator {
  process(record: Record): void {
    if (seen.has("")) return;
    seen.put("", "");
    emit(record.key, record.value);
  }
}

register("dedup", new Dedup());
