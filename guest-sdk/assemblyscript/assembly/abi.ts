// The raw clink guest ABI v1 (docs/abi.md): the clink_v1 imports and the result codes.
// Operators normally use the wrappers in index.ts; these are here for anything they do not
// cover. Only the imports a module actually calls end up in its import section.

/** ABI version this SDK targets. */
export const ABI_VERSION: i32 = 1;

/** Result codes (docs/abi.md, "Result codes"). */
export namespace Code {
  export const OK: i32 = 0;
  export const NOT_FOUND: i32 = -1;
  export const INVALID_ARGUMENT: i32 = -2;
  export const OUT_OF_BOUNDS: i32 = -3;
  export const TOO_LARGE: i32 = -4;
  export const NOT_ALLOWED: i32 = -5;
  export const NO_RESULT: i32 = -6;
  export const BUFFER_TOO_SMALL: i32 = -7;
  export const LOOKUP_TIMEOUT: i32 = -16;
  export const LOOKUP_BREAKER_OPEN: i32 = -17;
  export const LOOKUP_RESPONSE_TOO_LARGE: i32 = -18;
  export const LOOKUP_REFUSED: i32 = -19;
  export const LOOKUP_UNAVAILABLE: i32 = -20;
  export const LOOKUP_CANCELLED: i32 = -21;

  /** The ABI name of a code, e.g. "TOO_LARGE". */
  export function name(code: i32): string {
    switch (code) {
      case OK: return "OK";
      case NOT_FOUND: return "NOT_FOUND";
      case INVALID_ARGUMENT: return "INVALID_ARGUMENT";
      case OUT_OF_BOUNDS: return "OUT_OF_BOUNDS";
      case TOO_LARGE: return "TOO_LARGE";
      case NOT_ALLOWED: return "NOT_ALLOWED";
      case NO_RESULT: return "NO_RESULT";
      case BUFFER_TOO_SMALL: return "BUFFER_TOO_SMALL";
      case LOOKUP_TIMEOUT: return "LOOKUP_TIMEOUT";
      case LOOKUP_BREAKER_OPEN: return "LOOKUP_BREAKER_OPEN";
      case LOOKUP_RESPONSE_TOO_LARGE: return "LOOKUP_RESPONSE_TOO_LARGE";
      case LOOKUP_REFUSED: return "LOOKUP_REFUSED";
      case LOOKUP_UNAVAILABLE: return "LOOKUP_UNAVAILABLE";
      case LOOKUP_CANCELLED: return "LOOKUP_CANCELLED";
    }
    return "code(" + code.toString() + ")";
  }

  /** Whether the same lookup may succeed later (timeout, open breaker, unavailable). */
  export function isRetryable(code: i32): bool {
    return code == LOOKUP_TIMEOUT || code == LOOKUP_BREAKER_OPEN || code == LOOKUP_UNAVAILABLE;
  }
}

// @ts-ignore: decorator
@external("clink_v1", "get_async")
export declare function get_async(state: u32, keyPtr: usize, keyLen: u32, bufPtr: usize, bufCap: u32): i32;

// @ts-ignore: decorator
@external("clink_v1", "put")
export declare function put(state: u32, keyPtr: usize, keyLen: u32, valPtr: usize, valLen: u32): i32;

// @ts-ignore: decorator
@external("clink_v1", "delete")
export declare function del(state: u32, keyPtr: usize, keyLen: u32): i32;

// @ts-ignore: decorator
@external("clink_v1", "take_result")
export declare function take_result(bufPtr: usize, bufCap: u32): i32;

// @ts-ignore: decorator
@external("clink_v1", "emit")
export declare function emit(keyPtr: usize, keyLen: u32, valPtr: usize, valLen: u32): i32;

// @ts-ignore: decorator
@external("clink_v1", "timer_register")
export declare function timer_register(timestamp: i64): i32;

// @ts-ignore: decorator
@external("clink_v1", "timer_delete")
export declare function timer_delete(timestamp: i64): i32;

// @ts-ignore: decorator
@external("clink_v1", "processing_timer_register")
export declare function processing_timer_register(timestamp: i64): i32;

// @ts-ignore: decorator
@external("clink_v1", "processing_timer_delete")
export declare function processing_timer_delete(timestamp: i64): i32;

// @ts-ignore: decorator
@external("clink_v1", "watermark")
export declare function watermark(): i64;

// @ts-ignore: decorator
@external("clink_v1", "processing_time")
export declare function processing_time(): i64;

// @ts-ignore: decorator
@external("clink_v1", "log")
export declare function log(level: i32, msgPtr: usize, msgLen: u32): void;

// @ts-ignore: decorator
@external("clink_v1", "lookup")
export declare function lookup(endpoint: u32, reqPtr: usize, reqLen: u32, bufPtr: usize, bufCap: u32): i64;

// @ts-ignore: decorator
@external("clink_v1", "set_resume_order")
export declare function set_resume_order(order: i64): void;

// @ts-ignore: decorator
@external("clink_v1", "output_area")
export declare function output_area(ptr: usize, cap: u32): i32;

// @ts-ignore: decorator
@external("clink_v1", "flush_output")
export declare function flush_output(): i32;

/** Prefetch frames and the output area (docs/abi.md, "Fast paths"). */
export namespace Frame {
  /** Size of a frame's header: u32 len, u32 cap, u32 flags, u32 reserved. */
  export const HEADER: u32 = 16;
  /** A frame's len when the entry is absent, and what the guest writes to delete it. */
  export const ABSENT: u32 = 0xFFFFFFFF;
  /** A frame's len when the value exists but is too large to travel in the frame: read it with get_async. */
  export const TOO_LARGE: u32 = 0xFFFFFFFE;
  /** The flags bit that makes the host write the frame back. */
  export const DIRTY: u32 = 1;
  /** The smallest value area the host reserves. */
  export const MIN_CAP: u32 = 64;
  /** The most states a manifest may prefetch. */
  export const MAX_PREFETCH: i32 = 16;
}
