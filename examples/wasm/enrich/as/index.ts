// A clink-wasm operator that enriches each order with its user's profile, fetched through the
// lookup import from the pipeline's endpoint "users" (GET /users/<user>). It emits
// {"order":N,"user":U,"amount":A,"profile":P}, P being the profile as the upstream sent it, or
// null when the upstream has none (404). Any other answer, or a failed lookup, fails the
// record: the pipeline's retry policy has already had its go. Build: see ../../README.md.
import { Operator, Record, Buffer, Endpoint, JsonValue, json, register, emit } from "../../../../guest-sdk/assemblyscript/assembly";
export * from "../../../../guest-sdk/assemblyscript/assembly/exports";

const users = new Endpoint("users");
const user = new JsonValue();
const order = new JsonValue();
const amount = new JsonValue();
const name = new Buffer(64);
const out = new Buffer(512);

class Enrich extends Operator {
  process(record: Record): void {
    let v = record.value;
    if (!json.field(v, "user", user) || !user.unquoteInto(name.clear())) throw new Error("order without a user");
    if (!json.field(v, "order", order) || !json.field(v, "amount", amount)) throw new Error("order without order or amount");
    let r = users.lookup("GET", "/users/" + name.toString());
    if (!r.received) throw new Error("lookup of user " + name.toString() + " failed: code " + r.code.toString());
    out.clear().append('{"order":').append(order).append(',"user":').append(user);
    out.append(',"amount":').append(amount).append(',"profile":');
    if (r.status == 200) out.append(r.body);
    else if (r.status == 404) out.append("null");
    else throw new Error("lookup of user " + name.toString() + ": HTTP " + r.status.toString());
    out.appendByte(0x7D);
    emit(record.key, out);
  }
}

register("enrich", new Enrich());
