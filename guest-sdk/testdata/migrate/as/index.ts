// Version 2 of host/abi's migv1 counter, written with the AssemblyScript SDK and migrated by
// the host through assembly/migrate: state "count" holds {"n":N} (version 1 held N as 8 bytes
// little-endian), and a record whose stored value is in any other form fails, so an unmigrated
// value shows. Each record emits {"count":N,"v":2}. The migration drops the key "drop" and
// fails on the key "poison". host/pipeline TestHostMigrationSDKs runs it (the Go twin is
// ../go/main.go).
import { Operator, Record, State, Buffer, Bytes, register, emit, log } from "../../../assemblyscript/assembly";
import { setStateVersion, setMigrateFunction, MIGRATE_KEEP, MIGRATE_DROP, MIGRATE_FAIL } from "../../../assemblyscript/assembly/migrate";
export * from "../../../assemblyscript/assembly/exports";
export { clink_migrate, clink_state_versions } from "../../../assemblyscript/assembly/migrate";

const counts = new State("count");
const out = new Buffer(64);
const cell = new Buffer(32);

// parseCount reads {"n":N}; -1 when the value has another form.
function parseCount(v: Bytes): i64 {
  if (v.length < 7 || load<u8>(v.ptr) != 0x7B || load<u8>(v.ptr + <usize>v.length - 1) != 0x7D) return -1;
  if (load<u8>(v.ptr + 1) != 0x22 || load<u8>(v.ptr + 2) != 0x6E || load<u8>(v.ptr + 3) != 0x22 || load<u8>(v.ptr + 4) != 0x3A) return -1;
  let n: i64 = 0;
  for (let i = 5; i < v.length - 1; i++) {
    let c = load<u8>(v.ptr + <usize>i);
    if (c < 0x30 || c > 0x39) return -1;
    n = n * 10 + <i64>(c - 0x30);
  }
  return n;
}

class Counter extends Operator {
  process(record: Record): void {
    let n: i64 = 0;
    let v = counts.get("");
    if (v != null) {
      n = parseCount(v);
      if (n < 0) throw new Error("unmigrated value");
    }
    n++;
    counts.put("", cell.clear().append('{"n":').appendInt(n).appendByte(0x7D));
    out.clear().append('{"count":').appendInt(n).append(',"v":2}');
    emit(record.key, out);
  }
}

setStateVersion(2, [1]);
setMigrateFunction((state: u32, from: i32, key: Bytes, entry: Bytes, value: Bytes, o: Buffer): i32 => {
  if (key.equalsString("drop")) return MIGRATE_DROP;
  if (key.equalsString("poison")) {
    log.error("cannot migrate poison");
    return MIGRATE_FAIL;
  }
  if (state != counts.index || from != 1 || entry.length != 0 || value.length != 8) return MIGRATE_FAIL;
  o.append('{"n":').appendInt(load<i64>(value.ptr)).appendByte(0x7D);
  return MIGRATE_KEEP;
});

register("migcount", new Counter());
