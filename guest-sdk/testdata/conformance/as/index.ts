// Exercises every part of the AssemblyScript SDK inside a real wasm module. The record value is
// a command; guest-sdk/sdktest runs the same script against this module and the Go one
// (../go/main.go) and expects the same output from both.
import {
  Operator, Record, State, Endpoint, Header, Response, Bytes, Buffer, JsonValue, Code,
  register, emit, registerTimer, deleteTimer, setResumeOrder, watermark, processingTime, json, log, setKeyFunction,
} from "../../../assemblyscript/assembly";
export * from "../../../assemblyscript/assembly/exports";
export { clink_key } from "../../../assemblyscript/assembly/keyfunc";
// Batch calls are opt-in for AssemblyScript (exports.ts); the conformance module takes them so
// that the SDK's batch loop is tested (guest-sdk/sdktest, TestConformanceBatch).
export { clink_process_batch } from "../../../assemblyscript/assembly/operator";

const kv = new State("kv");
const dict = new State("map");
const big = new State("big");
const echo = new Endpoint("echo");
// Two prefetched states: the second frame's place depends on the first frame's cap.
const pf = new State("pf", { prefetch: true });
const pf2 = new State("pf2", { prefetch: true });

const out = new Buffer();
const tmp = new Buffer();
const field = new JsonValue();

function lookupResult(key: Bytes, r: Response): void {
  out.clear();
  if (!r.received) {
    out.append('{"error":"').append(Code.name(r.code)).append('","retryable":').append(r.retryable ? "true" : "false").append("}");
  } else {
    out.append('{"status":').appendInt(r.status).append(',"body":').appendJsonString(r.body).append("}");
  }
  emit(key, out);
}

/** Emits {"get":V} for pf's value, or {"get":null}. */
function emitGet(key: Bytes): void {
  let v = pf.get("");
  if (v === null) emit(key, '{"get":null}');
  else emit(key, out.clear().append('{"get":').appendJsonString(v).append("}"));
}

/** A JSON string of size bytes that starts with i: "17     ". */
function padded(i: i32, size: i32): Buffer {
  tmp.clear().appendByte(0x22).appendInt(i);
  while (tmp.length < size - 1) tmp.appendByte(0x20);
  return tmp.appendByte(0x22);
}

class Conformance extends Operator {
  open(): void {
    if (kv.put("", "x") == Code.NOT_ALLOWED) log.info("open: put NOT_ALLOWED");
    if (emit("", "1") == Code.NOT_ALLOWED) log.info("open: emit NOT_ALLOWED");
    if (pf.put("", "x") == Code.NOT_ALLOWED) log.info("open: prefetched put NOT_ALLOWED");
  }

  close(): void {
    emit("", '{"closed":true}');
  }

  onTimer(key: Bytes, timestamp: i64): void {
    out.clear().append('{"timer":').appendInt(timestamp).append(',"key":').appendJsonString(key);
    // A timer gets its key's frames too: read pf2, write pf2+timestamp back.
    if (pf2.has("")) {
      let n = pf2.getI64("");
      pf2.putI64("", n + timestamp);
      out.append(',"pf2":').appendInt(n);
    }
    emit(key, out.append("}"));
  }

  process(record: Record): void {
    let k = record.key;
    let text = record.value.toString();
    let sp = text.indexOf(" ");
    let cmd = sp < 0 ? text : text.substring(0, sp);
    let arg = sp < 0 ? "" : text.substring(sp + 1);

    if (cmd == "count") {
      let n = kv.getI64("") + 1;
      kv.putI64("", n);
      emit(k, out.clear().append('{"count":').appendInt(n).append("}"));
    } else if (cmd == "put") {
      let eq = arg.indexOf("=");
      check(dict.put(arg.substring(0, eq), arg.substring(eq + 1)));
    } else if (cmd == "get") {
      let v = dict.get(arg);
      if (v === null) emit(k, '{"get":null}');
      else emit(k, out.clear().append('{"get":').appendJsonString(v).append("}"));
    } else if (cmd == "del") {
      check(dict.delete(arg));
    } else if (cmd == "big") {
      let n = I32.parseInt(arg);
      let val = tmp.clear();
      for (let i = 0; i < n; i++) val.appendByte(<u8>(0x61 + i % 7));
      check(big.put("e", val));
      let got = big.get("e");
      if (got === null || !got.equals(val)) throw new Error("big: get returned something else");
      let mine = new Buffer();
      if (!big.getInto("e", mine) || !mine.equals(val)) throw new Error("big: getInto returned something else");
      mine.release();
      emit(k, out.clear().append('{"big":').appendInt(got.length).append("}"));
    } else if (cmd == "has") {
      emit(k, out.clear().append('{"has":').append(big.has("e") ? "true" : "false").append("}"));
    } else if (cmd == "timer") {
      check(registerTimer(I64.parseInt(arg)));
    } else if (cmd == "deltimer") {
      check(deleteTimer(I64.parseInt(arg)));
    } else if (cmd == "lookup") {
      lookupResult(k, echo.lookup("GET", arg, [new Header("X-Test", "1")]));
    } else if (cmd == "post") {
      lookupResult(k, echo.lookup("POST", "/echo", null, tmp.clear().append(arg)));
    } else if (cmd == "inject") {
      lookupResult(k, echo.lookup("GET", "/x\nHost: evil"));
    } else if (cmd == "hot") {
      let n = kv.getI64("hot") + 1;
      kv.putI64("hot", n);
      emit(k, out.clear().append('{"key":').appendJsonString(k).append(',"hot":').appendInt(n).append("}"));
    } else if (cmd == "phot") {
      // The counter example's hot path on a prefetched state: no import call.
      let n = pf2.getI64("") + 1;
      pf2.putI64("", n);
      emit(k, out.clear().append('{"key":').appendJsonString(k).append(',"phot":').appendInt(n).append("}"));
    } else if (cmd == "pcount") {
      let n = pf.getI64("") + 1;
      pf.putI64("", n);
      let m = pf2.getI64("") + 10;
      pf2.putI64("", m);
      emit(k, out.clear().append('{"pf":').appendInt(n).append(',"pf2":').appendInt(m).append("}"));
    } else if (cmd == "pget") {
      emitGet(k);
    } else if (cmd == "phas") {
      emit(k, out.clear().append('{"has":').append(pf.has("") ? "true" : "false").append("}"));
    } else if (cmd == "pputs") {
      // Each space-separated value in turn: write it, read it back.
      let parts = arg.split(" ");
      for (let i = 0; i < parts.length; i++) {
        check(pf.put("", parts[i]));
        emitGet(k);
      }
    } else if (cmd == "pdel") {
      check(pf.delete(""));
      emitGet(k);
    } else if (cmd == "pputdel") {
      // Write (maybe larger than the frame), then delete, in one call.
      check(pf.put("", arg));
      check(pf.delete(""));
      emitGet(k);
    } else if (cmd == "pentry") {
      // Another entry of a prefetched state: through the imports.
      check(pf.put("x", arg));
      let v = pf.get("x");
      emit(k, out.clear().append('{"entry":').appendJsonString(v === null ? new Bytes() : v).append("}"));
    } else if (cmd == "pint") {
      emit(k, out.clear().append('{"int":').appendInt(pf.getI64("")).append("}"));
    } else if (cmd == "pfail") {
      // Write and emit, then fail: neither may reach the host.
      check(pf.put("", arg));
      emit(k, '{"before":true}');
      throw new Error("failed on purpose after a write");
    } else if (cmd == "emitmany") {
      let sp2 = arg.indexOf(" ");
      let n = I32.parseInt(arg.substring(0, sp2));
      let size = I32.parseInt(arg.substring(sp2 + 1));
      for (let i = 0; i < n; i++) emit(k, padded(i, size));
    } else if (cmd == "emitmix") {
      // Small and large records interleaved: order must hold.
      let sizes: i32[] = [4, 70000, 4, 5000, 4];
      for (let i = 0; i < sizes.length; i++) emit(k, padded(i, sizes[i]));
    } else if (cmd == "mallocs") {
      emit(k, '{"mallocs":-1}'); // no allocation counter in the AssemblyScript runtime
    } else if (cmd == "order") {
      setResumeOrder(I64.parseInt(arg));
    } else if (cmd == "watermark") {
      emit(k, out.clear().append('{"watermark":').appendInt(watermark()).append("}"));
    } else if (cmd == "time") {
      emit(k, out.clear().append('{"time":').appendInt(processingTime()).append("}"));
    } else if (cmd == "log") {
      log.debug("debug " + arg);
      log.info("info " + arg);
      log.warn("warn " + arg);
      log.error("error " + arg);
    } else if (cmd == "fail") {
      throw new Error("failed on purpose: " + arg);
    } else if (cmd == "json") {
      let obj = tmp.clear().append(arg);
      if (!json.field(obj, "v", field)) {
        emit(k, '{"field":null}');
      } else if (!field.isInt) {
        emit(k, out.clear().append('{"field":').append(field).append(',"int":null}'));
      } else {
        emit(k, out.clear().append('{"field":').append(field).append(',"int":').appendInt(field.toInt()).append("}"));
      }
    } else if (cmd == "unquote") {
      let obj = tmp.clear().append(arg);
      if (!json.field(obj, "v", field)) {
        emit(k, '{"unquoted":null}');
      } else {
        let u = new Buffer();
        if (!field.unquoteInto(u)) emit(k, '{"unquoted":false}');
        else emit(k, out.clear().append('{"unquoted":').appendJsonString(u).append("}"));
        u.release();
      }
    } else if (cmd == "key") {
      emit(k, out.clear().append('{"key":').appendJsonString(k).append("}"));
    } else if (cmd == "bigemit") {
      let n = I32.parseInt(arg);
      out.clear().appendByte(0x22);
      for (let i = 0; i < n; i++) out.appendByte(0x79);
      emit(k, out.appendByte(0x22));
    } else {
      throw new Error("unknown command \"" + cmd + "\"");
    }
  }
}

function check(rc: i32): void {
  if (rc < 0) throw new Error(Code.name(rc));
}

register("conformance", new Conformance());

// Key records by their "user" field: a string unquoted, anything else as written.
const userField = new JsonValue();
const keyBuf = new Buffer();
setKeyFunction((value: Bytes, key: Bytes): bool => {
  if (!json.field(value, "user", userField)) return false;
  if (!userField.isString) {
    key.set(userField.ptr, userField.length);
    return true;
  }
  if (!userField.unquoteInto(keyBuf.clear())) return false;
  key.set(keyBuf.ptr, keyBuf.length);
  return true;
});
