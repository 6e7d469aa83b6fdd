// A clink-wasm operator that emits the first record of every key unchanged and drops the later
// ones. Build: see ../README.md.
import { Operator, Record, State, register, emit } from "../../../../guest-sdk/assemblyscript/assembly";
export * from "../../../../guest-sdk/assemblyscript/assembly/exports";

// An empty value for every key already emitted.
const seen = new State("seen");

class Dedup extends Operator {
  process(record: Record): void {
    if (seen.has("")) return;
    seen.put("", "");
    emit(record.key, record.value);
  }
}

register("dedup", new Dedup());
