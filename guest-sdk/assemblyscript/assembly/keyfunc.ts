// The optional key function (docs/abi.md, "clink_key"). Operators that key their own records
// set one and re-export clink_key from their entry file:
//
//     export * from "@clink-wasm/sdk/assembly/exports";
//     export { clink_key } from "@clink-wasm/sdk/assembly/keyfunc";
//     const user = new JsonValue();
//     const userKey = new Buffer();
//     setKeyFunction((value: Bytes, key: Bytes): bool => {
//       if (!json.field(value, "user", user) || !user.unquoteInto(userKey.clear())) return false;
//       key.set(userKey.ptr, userKey.length);
//       return true;
//     });
//
// The function must be pure: every import returns NOT_ALLOWED inside it (no state, no log). It
// points key at the key bytes (which may lie inside value) and returns true, or returns false
// to reject the record as malformed.

import { Bytes } from "./bytes";
import { inputBuffer } from "./operator";

let keyFn: ((value: Bytes, key: Bytes) => bool) | null = null;
const valueView = new Bytes();
const keyView = new Bytes();

/** Installs the key function. Call it at the top level of the entry file. */
export function setKeyFunction(fn: (value: Bytes, key: Bytes) => bool): void {
  keyFn = fn;
}

export function clink_key(valueLen: u32): i64 {
  let fn = keyFn;
  if (!fn) return -1;
  keyView.set(0, 0);
  if (!fn(valueView.set(inputBuffer(), <i32>valueLen), keyView)) return -1;
  return (<i64>keyView.ptr << 32) | <i64>(<u32>keyView.length);
}
