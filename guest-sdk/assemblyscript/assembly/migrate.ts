// Host-driven state migration (docs/abi.md, "clink_migrate"). An operator whose state format
// changed declares its state version and the older versions it restores, installs the
// conversion, and re-exports both exports from its entry file:
//
//     export * from "@clink-wasm/sdk/assembly/exports";
//     export { clink_migrate, clink_state_versions } from "@clink-wasm/sdk/assembly/migrate";
//     const counts = new State("count");
//     setStateVersion(2, [1]);
//     setMigrateFunction((state: u32, from: i32, key: Bytes, entry: Bytes, value: Bytes, out: Buffer): i32 => {
//       // version 1 stored an i64; version 2 stores it as decimal text
//       if (state != counts.index || value.length != 8) return MIGRATE_FAIL;
//       out.appendInt(load<i64>(value.ptr));
//       return MIGRATE_KEEP;
//     });
//
// On a restore from one of those versions the host calls the function once for every stored
// entry, before any record: state is the entry's state (compare it with a State's index), key
// the record key, entry the entry within the key's map (empty for a per-key value), value the
// stored bytes. The function appends the new value to out (empty when called) and returns
// MIGRATE_KEEP, or returns MIGRATE_DROP to delete the entry, or MIGRATE_FAIL to fail the
// restore: the call traps, and the host names the operator, state and key with the function's
// last error-level log line (log.error before returning MIGRATE_FAIL says why). It must be
// pure: the host allows no import inside it but log.
//
// A module of its own: importing it is what adds the two exports and the state version, so
// the modules that do not migrate stay exactly as they were.

import { Bytes, Buffer } from "./bytes";
import { inputBuffer } from "./operator";
import * as log from "./log";

export const MIGRATE_KEEP: i32 = 0;
export const MIGRATE_DROP: i32 = 1;
export const MIGRATE_FAIL: i32 = 2;

let migrateFn: ((state: u32, from: i32, key: Bytes, entry: Bytes, value: Bytes, out: Buffer) => i32) | null = null;
const versions = new Buffer();
const out = new Buffer();
const keyView = new Bytes();
const entryView = new Bytes();
const valueView = new Bytes();

/**
 * Declares the module's state version and the versions it migrates from (docs/abi.md, "State
 * versions on restore"). Call it at the top level of the entry file.
 */
export function setStateVersion(version: i32, migratesFrom: i32[]): void {
  versions.clear().append('{"state_version":').appendInt(version).append(',"migrates_from":[');
  for (let i = 0; i < migratesFrom.length; i++) {
    if (i > 0) versions.appendByte(0x2C);
    versions.appendInt(migratesFrom[i]);
  }
  versions.append("]}");
}

/** Installs the migration. Call it at the top level of the entry file. */
export function setMigrateFunction(fn: (state: u32, from: i32, key: Bytes, entry: Bytes, value: Bytes, out: Buffer) => i32): void {
  migrateFn = fn;
}

export function clink_migrate(state: u32, from: u32, keyLen: u32, entryLen: u32, valueLen: u32): i64 {
  let fn = migrateFn;
  if (!fn) {
    log.error("clink_migrate: setMigrateFunction was never called");
    unreachable();
  }
  let p = inputBuffer();
  keyView.set(p, <i32>keyLen);
  entryView.set(p + <usize>keyLen, <i32>entryLen);
  valueView.set(p + <usize>keyLen + <usize>entryLen, <i32>valueLen);
  out.clear();
  let rc = fn(state, <i32>from, keyView, entryView, valueView, out);
  if (rc == MIGRATE_DROP) return -1;
  if (rc != MIGRATE_KEEP) unreachable(); // the function logged why, if it wanted to

  return (<i64>out.ptr << 32) | <i64>(<u32>out.length);
}

export function clink_state_versions(): i64 {
  if (versions.length == 0) {
    log.error("clink_state_versions: setStateVersion was never called");
    unreachable();
  }
  return (<i64>versions.ptr << 32) | <i64>(<u32>versions.length);
}
