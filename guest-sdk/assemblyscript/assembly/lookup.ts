// HTTP lookups through pipeline-defined endpoints (docs/abi.md, "lookup").

import * as abi from "./abi";
import { Bytes, Buffer } from "./bytes";
import { declareEndpoint } from "./operator";
import { result, fetchInto } from "./state";

/** A request header. */
export class Header {
  constructor(public name: string, public value: string) {}
}

/**
 * The outcome of a lookup. The SDK reuses one Response; body is a view of its result buffer.
 * Both are valid until the next get or lookup.
 */
// @ts-ignore: decorator
@final
export class Response {
  /** HTTP status (> 0) when a response was received, else 0. */
  status: i32 = 0;
  /** 0 when a response was received, else a negative Code (Code.LOOKUP_TIMEOUT, ...). */
  code: i32 = 0;
  /** The response body (empty on error). */
  body: Bytes = new Bytes();

  /** Whether a response was received (whatever its status). */
  get received(): bool {
    return this.code == 0;
  }

  /** Whether a response was received with a 2xx status. */
  get ok(): bool {
    return this.code == 0 && this.status >= 200 && this.status < 300;
  }

  /** Whether a failed lookup may succeed later (timeout, open breaker, unavailable). */
  get retryable(): bool {
    return abi.Code.isRetryable(this.code);
  }
}

const response = new Response();
const request = new Buffer(256);

function hasLineBreak(s: string): bool {
  return s.includes("\n") || s.includes("\r");
}

/**
 * A named HTTP endpoint. The pipeline defines it (base URL, secrets, timeouts, retries, limits);
 * the module names it and requests paths below it. Declare endpoints at the top level:
 *
 *     const geo = new Endpoint("geo");
 */
export class Endpoint {
  readonly name: string;
  readonly index: u32;

  /** Declares an endpoint (1-128 characters of [A-Za-z0-9_.-], unique, at most 64). */
  constructor(name: string) {
    this.name = name;
    this.index = declareEndpoint(name);
  }

  /**
   * Sends a request and waits for the response (the call may suspend; the operator does not
   * see it). method is GET, HEAD, POST, PUT, PATCH or DELETE; path starts with "/" and may
   * carry a query. A non-2xx status is a response, not an error. A method, path or header
   * with a line break is refused here with Code.LOOKUP_REFUSED, before anything is sent.
   */
  lookup(method: string, path: string, headers: Array<Header> | null = null, body: Bytes | null = null): Response {
    let r = response;
    r.status = 0;
    r.code = 0;
    r.body.set(0, 0);
    if (hasLineBreak(method) || hasLineBreak(path)) {
      r.code = abi.Code.LOOKUP_REFUSED;
      return r;
    }
    let q = request.clear();
    q.append(method).appendByte(0x20).append(path).appendByte(0x0A);
    if (headers) {
      for (let i = 0; i < headers.length; i++) {
        let h = unchecked(headers[i]);
        if (h.name.length == 0 || h.name.includes(":") || hasLineBreak(h.name) || hasLineBreak(h.value)) {
          r.code = abi.Code.LOOKUP_REFUSED;
          return r;
        }
        q.append(h.name).append(": ").append(h.value).appendByte(0x0A);
      }
    }
    if (body && body.length > 0) {
      q.appendByte(0x0A).appendRaw(body.ptr, body.length);
    }
    let packed = abi.lookup(this.index, q.ptr, <u32>q.length, result.ptr, <u32>result.capacity);
    if (request.capacity > (1 << 20)) request.release();
    if (packed < 0) {
      r.code = <i32>packed;
      return r;
    }
    let n = <i32>(<u32>(packed & 0xFFFFFFFF));
    let rc = fetchInto(result, n);
    if (rc < 0) {
      r.code = rc;
      return r;
    }
    r.status = <i32>(packed >> 32);
    r.body.set(result.ptr, rc);
    return r;
  }
}
