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

  // @ts-ignore: decorator
  @inline
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
   * is copied four code units at a time with no separate length pass: loop iterations are
   * what the host's fuel instrumentation makes expensive. Short ASCII literals are encoded
   * once and then copied from a cache (see literalCache).
   */
  appendString(s: string): this {
    let src = changetype<usize>(s);
    let slot: usize = 0;
    if (src < __heap_base) {
      // A static string (a literal): immutable and never freed, so its address identifies it.
      slot = literalSlot(src);
      if (load<usize>(slot) == src) {
        let n = <i32>load<u32>(slot, LIT_LEN);
        this.reserve(n);
        copyBytes(this.ptr + <usize>this.length, slot + LIT_DATA, <usize>n);
        this.length += n;
        return this;
      }
    }
    let n = s.length;
    this.reserve(n);
    let dst = this.ptr + <usize>this.length;
    let i = 0;
    for (; i + 4 <= n; i += 4) {
      let w = load<u64>(src + (<usize>i << 1));
      if ((w & 0xFF80FF80FF80FF80) != 0) break; // a unit >= 0x80 among the four
      store<u32>(dst + <usize>i, <u32>(w & 0xFF) | <u32>((w >> 8) & 0xFF00) | <u32>((w >> 16) & 0xFF0000) | <u32>((w >> 24) & 0xFF000000));
    }
    for (; i < n; i++) {
      let c = load<u16>(src + (<usize>i << 1));
      if (c >= 0x80) {
        // Non-ASCII: encode the rest with the standard library.
        this.length += i;
        return this.appendUTF8Tail(src + (<usize>i << 1), n - i);
      }
      store<u8>(dst + <usize>i, <u8>c);
    }
    if (slot != 0 && n <= LIT_MAX) {
      copyBytes(slot + LIT_DATA, dst, <usize>n);
      store<u32>(slot, <u32>n, LIT_LEN);
      store<usize>(slot, src);
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

  /**
   * Appends v in decimal. The digits are written in place, two per division (a division is
   * the expensive instruction here), and with 32-bit divisions below 2^32.
   */
  appendInt(v: i64): this {
    this.reserve(20);
    let d = this.ptr + <usize>this.length;
    let u: u64 = v < 0 ? <u64>0 - <u64>v : <u64>v;
    if (v < 0) store<u8>(d++, 0x2D);
    let end: usize;
    if (u < 10) {
      store<u8>(d, <u8>(0x30 + <u32>u));
      end = d + 1;
    } else if (u <= <u64>u32.MAX_VALUE) {
      let w = <u32>u;
      end = d + <usize>decimalCount32(w);
      let q = end;
      while (w >= 100) {
        let r = w % 100;
        w /= 100;
        q -= 2;
        store<u16>(q, load<u16>(digitPairs + (<usize>r << 1)));
      }
      if (w >= 10) store<u16>(q - 2, load<u16>(digitPairs + (<usize>w << 1)));
      else store<u8>(q - 1, <u8>(0x30 + w));
    } else {
      let n = 10;
      for (let t = u / 10_000_000_000; t != 0; t /= 10) n++;
      end = d + <usize>n;
      let q = end;
      while (u >= 100) {
        let r = <u32>(u % 100);
        u /= 100;
        q -= 2;
        store<u16>(q, load<u16>(digitPairs + (<usize>r << 1)));
      }
      if (u >= 10) store<u16>(q - 2, load<u16>(digitPairs + (<usize>u << 1)));
      else store<u8>(q - 1, <u8>(0x30 + <u32>u));
    }
    this.length = <i32>(end - this.ptr);
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
    } else if (v instanceof Bytes) {
      p = v.ptr;
      n = v.length;
    } else {
      view<T>(v, argView);
      p = argView.ptr;
      n = argView.length;
    }
    // Room for the common case, nothing to escape; an escape reserves what it needs. d is the
    // write position: bytes are copied while they are scanned, eight at a time while none of
    // them needs escaping (SWAR: a byte below 0x20, '"' or '\\').
    this.reserve(n + 2);
    let d = this.ptr + <usize>this.length;
    store<u8>(d++, 0x22);
    let i = 0;
    while (i < n) {
      if (i + 8 <= n) {
        let x = load<u64>(p + <usize>i);
        let q = x ^ 0x2222222222222222;
        let b = x ^ 0x5C5C5C5C5C5C5C5C;
        // (v - 0x01..) & ~v has a high bit set iff some byte of v is zero, (x - 0x20..) & ~x
        // iff some byte of x is below 0x20: exact answers to "any?", which is all we ask.
        let hit = ((x - 0x2020202020202020) & ~x) | ((q - 0x0101010101010101) & ~q) | ((b - 0x0101010101010101) & ~b);
        if ((hit & 0x8080808080808080) == 0) {
          store<u64>(d, x);
          d += 8;
          i += 8;
          continue;
        }
      }
      let c = load<u8>(p + <usize>i);
      i++;
      if (c >= 0x20 && c != 0x22 && c != 0x5C) {
        store<u8>(d++, c);
        continue;
      }
      // An escape: up to 6 bytes for this one, then the rest and the closing quote.
      this.length = <i32>(d - this.ptr);
      this.reserve(6 + (n - i) + 1);
      d = this.ptr + <usize>this.length;
      store<u8>(d++, 0x5C);
      if (c == 0x22 || c == 0x5C) store<u8>(d++, c);
      else if (c == 0x08) store<u8>(d++, 0x62); // b
      else if (c == 0x09) store<u8>(d++, 0x74); // t
      else if (c == 0x0A) store<u8>(d++, 0x6E); // n
      else if (c == 0x0C) store<u8>(d++, 0x66); // f
      else if (c == 0x0D) store<u8>(d++, 0x72); // r
      else {
        store<u32>(d, 0x30303075); // u00
        store<u8>(d + 3, hexDigit(c >> 4));
        store<u8>(d + 4, hexDigit(c & 0xF));
        d += 5;
      }
    }
    store<u8>(d++, 0x22);
    this.length = <i32>(d - this.ptr);
    return this;
  }
}

// The literal cache: the UTF-8 encoding of short ASCII string literals, so that appending one
// is a copy rather than a transcoding loop. Direct-mapped on the literal's address; a slot is
// [address (usize), length (u32), padding, up to LIT_MAX bytes].
const LIT_SLOTS: usize = 32;
const LIT_LEN: usize = 4;
const LIT_DATA: usize = 8;
const LIT_MAX: i32 = 32;
const LIT_SLOT_SIZE: usize = LIT_DATA + <usize>LIT_MAX;
const literalCache = memory.data(<i32>(LIT_SLOTS * LIT_SLOT_SIZE), 8);

// @ts-ignore: decorator
@inline
function literalSlot(p: usize): usize {
  return literalCache + (((p >> 3) ^ (p >> 8)) & (LIT_SLOTS - 1)) * LIT_SLOT_SIZE;
}

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

/** "00" to "99": two decimal digits per lookup. */
const digitPairs = memory.data(200);
for (let i = 0; i < 100; i++) {
  store<u8>(digitPairs + <usize>(i << 1), <u8>(0x30 + i / 10));
  store<u8>(digitPairs + <usize>(i << 1) + 1, <u8>(0x30 + i % 10));
}

/** The number of decimal digits of v. */
function decimalCount32(v: u32): u32 {
  if (v < 100000) {
    if (v < 100) return v < 10 ? 1 : 2;
    return v < 1000 ? 3 : v < 10000 ? 4 : 5;
  }
  if (v < 10000000) return v < 1000000 ? 6 : 7;
  return v < 100000000 ? 8 : v < 1000000000 ? 9 : 10;
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

/** Whether v, any value view() accepts, holds no bytes. Decided without writing a view. */
// @ts-ignore: decorator
@inline
export function isEmptyArg<T>(v: T): bool {
  if (isNullable<T>()) {
    if (changetype<usize>(v) == 0) return true;
  }
  if (isString<T>()) {
    return changetype<string>(v).length == 0;
  } else if (v instanceof Bytes) {
    return v.length == 0;
  } else if (v instanceof ArrayBuffer) {
    return v.byteLength == 0;
  } else if (v instanceof Uint8Array) {
    return v.length == 0;
  } else if (v instanceof StaticArray<u8>) {
    return v.length == 0;
  }
  return false;
}

/**
 * Points out at the bytes of v: a Bytes (or Buffer), an ArrayBuffer, a Uint8Array, a
 * StaticArray<u8>, or a string, which is encoded to UTF-8 into scratch. null is empty.
 */
// @ts-ignore: decorator
@inline
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
