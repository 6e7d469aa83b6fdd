// Byte views and buffers that live outside the garbage-collected heap, so that the hot path
// (read a record, read state, build and emit a result) allocates nothing.

/**
 * A view of `length` bytes at `ptr` in linear memory. The SDK hands out views of the input
 * buffer (record key and value) and of its result buffer (state values, lookup bodies); they
 * are only valid for as long as the documentation of the call that returned them says.
 */
export class Bytes {
  ptr: usize;
  length: i32;

  constructor(ptr: usize = 0, length: i32 = 0) {
    this.ptr = ptr;
    this.length = length;
  }

  /** Points the view at other bytes; returns this. */
  set(ptr: usize, length: i32): this {
    this.ptr = ptr;
    this.length = length;
    return this;
  }

  /** The byte at index i (bounds-checked). */
  // @ts-ignore: decorator
  @operator("[]")
  at(i: i32): u8 {
    if (<u32>i >= <u32>this.length) throw new RangeError("Bytes index out of range");
    return load<u8>(this.ptr + <usize>i);
  }

  get isEmpty(): bool {
    return this.length == 0;
  }

  /** Whether the bytes equal the UTF-8 encoding of s (no allocation). */
  equalsString(s: string): bool {
    let n = String.UTF8.byteLength(s);
    if (n != this.length) return false;
    let len = s.length;
    let p = this.ptr;
    for (let i = 0; i < len; i++) {
      let c = <u32>s.charCodeAt(i);
      if (c < 0x80) {
        if (load<u8>(p++) != <u8>c) return false;
      } else {
        // Rare: compare through an encoded copy.
        let buf = String.UTF8.encode(s);
        return memory.compare(this.ptr, changetype<usize>(buf), <usize>n) == 0;
      }
    }
    return true;
  }

  /** Whether both views hold the same bytes. */
  equals(other: Bytes): bool {
    return this.length == other.length && memory.compare(this.ptr, other.ptr, <usize>this.length) == 0;
  }

  /** Decodes the bytes as UTF-8 (allocates a string; invalid sequences become U+FFFD). */
  toString(): string {
    return String.UTF8.decodeUnsafe(this.ptr, <usize>this.length);
  }

  /** Copies the bytes into a new Uint8Array (allocates). */
  toUint8Array(): Uint8Array {
    let a = new Uint8Array(this.length);
    memory.copy(a.dataStart, this.ptr, <usize>this.length);
    return a;
  }
}

/**
 * A growable byte buffer in unmanaged memory: clear and refill it for every record to build
 * output without allocating. It is a Bytes, so it can be passed to emit and state.put; growing
 * it moves `ptr`, so take views of it only after the last append.
 */
export class Buffer extends Bytes {
  capacity: i32 = 0;

  constructor(capacity: i32 = 0) {
    super(0, 0);
    if (capacity > 0) this.reserve(capacity);
  }

  /** Empties the buffer, keeping its memory; returns this. */
  clear(): this {
    this.length = 0;
    return this;
  }

  /** Makes room for n more bytes. */
  // @ts-ignore: decorator
  @inline
  reserve(n: i32): void {
    let need = this.length + n;
    if (need > this.capacity) this.grow(need);
  }

  private grow(need: i32): void {
    let c = this.capacity < 64 ? 64 : this.capacity;
    while (c < need) c <<= 1;
    // heap.realloc does not accept a null pointer, unlike C's realloc.
    this.ptr = this.ptr == 0 ? heap.alloc(<usize>c) : heap.realloc(this.ptr, <usize>c);
    this.capacity = c;
  }

  /** Releases the memory (the buffer stays usable and grows again on the next append). */
  release(): void {
    if (this.ptr != 0) heap.free(this.ptr);
    this.ptr = 0;
    this.length = 0;
    this.capacity = 0;
  }

  appendByte(c: u8): this {
    this.reserve(1);
    store<u8>(this.ptr + <usize>this.length, c);
    this.length++;
    return this;
  }

  /** Appends raw bytes from linear memory. */
  appendRaw(ptr: usize, n: i32): this {
    if (n <= 0) return this;
    this.reserve(n);
    copyBytes(this.ptr + <usize>this.length, ptr, <usize>n);
    this.length += n;
    return this;
  }

  /** Appends a string as UTF-8, a Bytes, an ArrayBuffer, a Uint8Array or a StaticArray<u8>. */
  append<T>(v: T): this {
    if (isString<T>()) {
      let s = changetype<string>(v);
      if (isNullable<T>()) {
        if (changetype<usize>(v) == 0) return this;
      }
      return this.appendString(s);
    } else {
      view<T>(v, argView);
      return this.appendRaw(argView.ptr, argView.length);
    }
  }

  /**
   * Appends s as UTF-8. ASCII, the common case for the literals operators build output from,
   * is copied one code unit at a time with no separate length pass.
   */
  appendString(s: string): this {
    let n = s.length;
    this.reserve(n);
    let src = changetype<usize>(s);
    let dst = this.ptr + <usize>this.length;
    for (let i = 0; i < n; i++) {
      let c = load<u16>(src + (<usize>i << 1));
      if (c >= 0x80) {
        // Non-ASCII: encode the rest with the standard library.
        this.length += i;
        return this.appendUTF8Tail(src + (<usize>i << 1), n - i);
      }
      store<u8>(dst + <usize>i, <u8>c);
    }
    this.length += n;
    return this;
  }

  private appendUTF8Tail(src: usize, units: i32): this {
    // Worst case 3 bytes per UTF-16 code unit.
    this.reserve(units * 3);
    this.length += <i32>String.UTF8.encodeUnsafe(src, units, this.ptr + <usize>this.length);
    return this;
  }

  /** Appends v in decimal. */
  appendInt(v: i64): this {
    this.reserve(20);
    let u: u64 = v < 0 ? <u64>0 - <u64>v : <u64>v;
    if (v < 0) {
      store<u8>(this.ptr + <usize>this.length, 0x2D);
      this.length++;
    }
    if (u < 10) {
      store<u8>(this.ptr + <usize>this.length, <u8>(0x30 + <u32>u));
      this.length++;
      return this;
    }
    // Digits backwards into a scratch area, then copied in order: one division per digit.
    let end = digitScratch + 20;
    let p = end;
    do {
      p--;
      store<u8>(p, <u8>(0x30 + <u32>(u % 10)));
      u /= 10;
    } while (u != 0);
    let n = <i32>(end - p);
    memory.copy(this.ptr + <usize>this.length, p, <usize>n);
    this.length += n;
    return this;
  }

  /**
   * Appends v as a JSON string, quotes included. Escapes '"', '\\' and the control characters
   * below U+0020 (\b \t \n \f \r, otherwise \u00XX in lowercase hex) and copies every other
   * byte as is: the same output as the Go SDK's jsonx.AppendString.
   */
  appendJsonString<T>(v: T): this {
    let p: usize, n: i32;
    if (isString<T>()) {
      let tmp = stringScratch.clear().append<T>(v);
      p = tmp.ptr;
      n = tmp.length;
    } else {
      view<T>(v, argView);
      p = argView.ptr;
      n = argView.length;
    }
    this.reserve(n + 2);
    this.appendByte(0x22);
    let start = 0;
    for (let i = 0; i < n; i++) {
      let c = load<u8>(p + <usize>i);
      if (c >= 0x20 && c != 0x22 && c != 0x5C) continue;
      this.appendRaw(p + <usize>start, i - start);
      this.appendByte(0x5C);
      if (c == 0x22 || c == 0x5C) this.appendByte(c);
      else if (c == 0x08) this.appendByte(0x62); // b
      else if (c == 0x09) this.appendByte(0x74); // t
      else if (c == 0x0A) this.appendByte(0x6E); // n
      else if (c == 0x0C) this.appendByte(0x66); // f
      else if (c == 0x0D) this.appendByte(0x72); // r
      else {
        this.appendByte(0x75).appendByte(0x30).appendByte(0x30);
        this.appendByte(hexDigit(c >> 4)).appendByte(hexDigit(c & 0xF));
      }
      start = i + 1;
    }
    this.appendRaw(p + <usize>start, n - start);
    return this.appendByte(0x22);
  }
}

const digitScratch = memory.data(20);

/**
 * Copies n bytes from src to dst (the ranges must not overlap). Up to 32 bytes, the common size
 * of keys, literals and small values, are copied with overlapping loads and stores: memory.copy
 * is a call out of the compiled guest code in wazero, which costs more than the copy itself.
 */
// @ts-ignore: decorator
@inline
export function copyBytes(dst: usize, src: usize, n: usize): void {
  if (n >= 8) {
    if (n > 16) {
      if (n > 32) {
        memory.copy(dst, src, n);
        return;
      }
      let a = load<u64>(src);
      let b = load<u64>(src, 8);
      let c = load<u64>(src + n - 16);
      let d = load<u64>(src + n - 8);
      store<u64>(dst, a);
      store<u64>(dst, b, 8);
      store<u64>(dst + n - 16, c);
      store<u64>(dst + n - 8, d);
      return;
    }
    let a = load<u64>(src);
    let b = load<u64>(src + n - 8);
    store<u64>(dst, a);
    store<u64>(dst + n - 8, b);
  } else if (n >= 4) {
    let a = load<u32>(src);
    let b = load<u32>(src + n - 4);
    store<u32>(dst, a);
    store<u32>(dst + n - 4, b);
  } else if (n != 0) {
    // 1-3 bytes: first, middle and last (some of them the same byte).
    let a = load<u8>(src);
    let b = load<u8>(src + (n >> 1));
    let c = load<u8>(src + n - 1);
    store<u8>(dst, a);
    store<u8>(dst + (n >> 1), b);
    store<u8>(dst + n - 1, c);
  }
}

// @ts-ignore: decorator
@inline
function hexDigit(d: u8): u8 {
  return d < 10 ? 0x30 + d : 0x57 + d; // 'a' - 10 = 0x57
}

/** Scratch buffer for encoding string arguments (one per argument position). */
export const stringScratch = new Buffer();
export const keyScratch = new Buffer();
export const valueScratch = new Buffer();
const argView = new Bytes();

/**
 * Points out at the bytes of v: a Bytes (or Buffer), an ArrayBuffer, a Uint8Array, a
 * StaticArray<u8>, or a string, which is encoded to UTF-8 into scratch. null is empty.
 */
export function view<T>(v: T, out: Bytes, scratch: Buffer = stringScratch): Bytes {
  if (isNullable<T>()) {
    if (changetype<usize>(v) == 0) return out.set(0, 0);
  }
  if (isString<T>()) {
    if (changetype<string>(v).length == 0) return out.set(0, 0);
    scratch.clear().append<T>(v);
    return out.set(scratch.ptr, scratch.length);
  } else if (v instanceof Bytes) {
    return out.set(v.ptr, v.length);
  } else if (v instanceof ArrayBuffer) {
    return out.set(changetype<usize>(v), v.byteLength);
  } else if (v instanceof Uint8Array) {
    return out.set(v.dataStart, v.length);
  } else if (v instanceof StaticArray<u8>) {
    return out.set(changetype<usize>(v), v.length);
  } else {
    ERROR("expected a string, Bytes, ArrayBuffer, Uint8Array or StaticArray<u8>");
  }
  return out;
}
