//! The clink-wasm guest SDK for Rust: write a keyed stream operator against the guest ABI v1
//! (docs/abi.md) and build it for `wasm32-wasi` as a cdylib. No dependency outside `std`.
//!
//! ```ignore
//! use clink::{Operator, Record, State};
//!
//! struct Counter { counts: State, out: Vec<u8> }
//!
//! impl Operator for Counter {
//!     fn process(&mut self, r: &Record) -> clink::Result<()> {
//!         let n = self.counts.get_i64(b"")?.unwrap_or(0) + 1;
//!         self.counts.put_i64(b"", n)?;
//!         self.out.clear();
//!         self.out.extend_from_slice(b"{\"key\":");
//!         clink::json::append_string(&mut self.out, r.key);
//!         self.out.extend_from_slice(b",\"count\":");
//!         clink::json::append_int(&mut self.out, n);
//!         self.out.push(b'}');
//!         clink::emit(r.key, &self.out)
//!     }
//! }
//!
//! // Declarations happen in the constructor, which the SDK runs once per instance before the
//! // host reads the manifest.
//! clink::export_operator!("counter", || Counter {
//!     counts: State::new("count", clink::PREFETCH),
//!     out: Vec::new(),
//! });
//! ```
//!
//! The API is the Go, AssemblyScript and C SDKs' (guest-sdk/README.md): states with prefetch
//! (a prefetched state's per-key value travels with the record and is written back by the
//! host, with no import call), lookups, emit through the output area, timers, watermark and
//! processing time, logs, an optional key function, and a JSON toolkit that behaves exactly
//! like the Go SDK's jsonx.
//!
//! WebAssembly instances are single-threaded and the host never re-enters one: the SDK keeps its
//! runtime in one `static mut`, touched only from the export calls.

#![allow(clippy::missing_safety_doc)]

use std::fmt;

/// The ABI version this SDK speaks (imports from module `clink_v1`).
pub const ABI_VERSION: i32 = 1;

/// `State::new` flag: a prefetched state (docs/abi.md, "Prefetched values").
pub const PREFETCH: u32 = 1;

/// Watermark before the first watermark.
pub const WATERMARK_NONE: i64 = i64::MIN;
/// Watermark at end of input.
pub const WATERMARK_END: i64 = i64::MAX;

/// A result code of the ABI (docs/abi.md, "Result codes").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Code(pub i32);

impl Code {
    pub const NOT_FOUND: Code = Code(-1);
    pub const INVALID_ARGUMENT: Code = Code(-2);
    pub const OUT_OF_BOUNDS: Code = Code(-3);
    pub const TOO_LARGE: Code = Code(-4);
    pub const NOT_ALLOWED: Code = Code(-5);
    pub const NO_RESULT: Code = Code(-6);
    pub const BUFFER_TOO_SMALL: Code = Code(-7);
    pub const LOOKUP_TIMEOUT: Code = Code(-16);
    pub const LOOKUP_BREAKER_OPEN: Code = Code(-17);
    pub const LOOKUP_RESPONSE_TOO_LARGE: Code = Code(-18);
    pub const LOOKUP_REFUSED: Code = Code(-19);
    pub const LOOKUP_UNAVAILABLE: Code = Code(-20);
    pub const LOOKUP_CANCELLED: Code = Code(-21);

    /// The code's name, e.g. `"LOOKUP_TIMEOUT"`.
    pub fn name(self) -> &'static str {
        match self.0 {
            -1 => "NOT_FOUND",
            -2 => "INVALID_ARGUMENT",
            -3 => "OUT_OF_BOUNDS",
            -4 => "TOO_LARGE",
            -5 => "NOT_ALLOWED",
            -6 => "NO_RESULT",
            -7 => "BUFFER_TOO_SMALL",
            -16 => "LOOKUP_TIMEOUT",
            -17 => "LOOKUP_BREAKER_OPEN",
            -18 => "LOOKUP_RESPONSE_TOO_LARGE",
            -19 => "LOOKUP_REFUSED",
            -20 => "LOOKUP_UNAVAILABLE",
            -21 => "LOOKUP_CANCELLED",
            c if c >= 0 => "OK",
            _ => "UNKNOWN",
        }
    }

    /// Whether a failed lookup may succeed if tried again later (a timeout, an open breaker,
    /// an unavailable upstream).
    pub fn retryable(self) -> bool {
        self == Code::LOOKUP_TIMEOUT || self == Code::LOOKUP_BREAKER_OPEN || self == Code::LOOKUP_UNAVAILABLE
    }
}

/// An error: a result code from the host (with the operation that got it), or the operator's
/// own message. An error returned by a callback fails the record: the SDK logs its text at
/// error level, and the host reports it (docs/abi.md, "Faults").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    Code { op: &'static str, code: Code },
    Message(String),
}

impl Error {
    /// The result code, for an error from the host.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Code { code, .. } => Some(*code),
            Error::Message(_) => None,
        }
    }

    /// Whether the failed operation may succeed later (lookups; see [`Code::retryable`]).
    pub fn retryable(&self) -> bool {
        self.code().map_or(false, Code::retryable)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Code { op, code } => write!(f, "{}: {}", op, code.name()),
            Error::Message(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

impl From<&str> for Error {
    fn from(s: &str) -> Error {
        Error::Message(s.to_string())
    }
}

impl From<String> for Error {
    fn from(s: String) -> Error {
        Error::Message(s)
    }
}

/// The SDK's result type.
pub type Result<T> = std::result::Result<T, Error>;

fn check(op: &'static str, rc: i32) -> Result<()> {
    if rc < 0 {
        Err(Error::Code { op, code: Code(rc) })
    } else {
        Ok(())
    }
}

/// One input record. `key` and `value` point into the host's input buffer.
pub struct Record<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// Event time, ms since the Unix epoch.
    pub timestamp: i64,
}

/// An operator. `process` is required. `on_timer` runs in the context of the timer's key, like
/// `process` for a record of that key; an operator that registers timers implements it and
/// returns true from `handles_timers`. `open` runs once per instance (not once per pipeline);
/// `close` may emit. State and timers are not available in `open` and `close`.
pub trait Operator {
    fn process(&mut self, r: &Record) -> Result<()>;
    fn on_timer(&mut self, _key: &[u8], _timestamp: i64) -> Result<()> {
        Err(Error::Message(format!("clink: a timer fired but operator {} has no on_timer", name())))
    }
    /// Whether the operator implements `on_timer`; `register_timer` is refused
    /// (`NOT_ALLOWED`) otherwise, as in the other SDKs.
    fn handles_timers(&self) -> bool {
        false
    }
    fn open(&mut self) -> Result<()> {
        Ok(())
    }
    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Log levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Debug = 0,
    Info = 1,
    Warn = 2,
    Error = 3,
}

/// The raw `clink_v1` imports (docs/abi.md, "Imports").
pub mod sys {
    #[link(wasm_import_module = "clink_v1")]
    extern "C" {
        pub fn get_async(state: u32, key: *const u8, key_len: u32, buf: *mut u8, cap: u32) -> i32;
        pub fn put(state: u32, key: *const u8, key_len: u32, val: *const u8, val_len: u32) -> i32;
        pub fn delete(state: u32, key: *const u8, key_len: u32) -> i32;
        pub fn take_result(buf: *mut u8, cap: u32) -> i32;
        pub fn emit(key: *const u8, key_len: u32, val: *const u8, val_len: u32) -> i32;
        pub fn timer_register(ts: i64) -> i32;
        pub fn timer_delete(ts: i64) -> i32;
        pub fn watermark() -> i64;
        pub fn processing_time() -> i64;
        pub fn log(level: i32, msg: *const u8, len: u32);
        pub fn lookup(endpoint: u32, req: *const u8, req_len: u32, buf: *mut u8, cap: u32) -> i64;
        pub fn set_resume_order(order: i64);
        pub fn output_area(ptr: *mut u8, cap: u32) -> i32;
        pub fn flush_output() -> i32;
    }
}

// ---- Fast-path layout (docs/abi.md, "Fast paths") ----

const FRAME_HEADER: usize = 16;
const FRAME_ABSENT: u32 = 0xFFFF_FFFF;
const FRAME_TOO_LARGE: u32 = 0xFFFF_FFFE;
const FRAME_DIRTY: u32 = 1;
const FRAME_MIN_CAP: u32 = 64;
const MAX_STATES: usize = 256;
const MAX_PREFETCH: usize = 16;
const MAX_ENDPOINTS: usize = 64;
/// The output area's size: 16 KiB, as in the C SDK.
const AREA_SIZE: usize = 16384;
const MAX_INPUT: u32 = 1 << 30;

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn put_le32(b: &mut [u8], v: u32) {
    b[..4].copy_from_slice(&v.to_le_bytes());
}

/// Per prefetched state: its frame's offset in the input buffer during `process` and
/// `on_timer` (-1 outside them), and whether the entry was last written with the put import
/// (a value larger than the frame), so that reads go through `get_async`.
/// INVARIANT: `frame >= 0` only while the frame belongs to the current call.
#[derive(Clone, Copy)]
struct Frame {
    frame: i64,
    stale: bool,
}

struct Runtime {
    name: &'static str,
    op: Option<Box<dyn Operator>>,
    sealed: bool,
    states: Vec<&'static str>,
    prefetched: Vec<&'static str>,
    frames: Vec<Frame>,
    endpoints: Vec<&'static str>,
    manifest: Vec<u8>,
    input: Vec<u8>,
    result: Vec<u8>,
    request: Vec<u8>,
    /// 0 before the first emit, 1 once the area is registered, -1 when the host refused it.
    area_state: i8,
    /// In process, on_timer or close: the calls whose return drains the area.
    emitting: bool,
}

static mut RT: Runtime = Runtime {
    name: "",
    op: None,
    sealed: false,
    states: Vec::new(),
    prefetched: Vec::new(),
    frames: Vec::new(),
    endpoints: Vec::new(),
    manifest: Vec::new(),
    input: Vec::new(),
    result: Vec::new(),
    request: Vec::new(),
    area_state: 0,
    emitting: false,
};

static mut AREA: [u32; AREA_SIZE / 4] = [0; AREA_SIZE / 4];

fn rt() -> &'static mut Runtime {
    // SAFETY: a WebAssembly instance is single-threaded and never re-entered; the SDK never
    // holds two of these references across a call that could make another.
    unsafe { &mut *std::ptr::addr_of_mut!(RT) }
}

fn area() -> &'static mut [u8] {
    // SAFETY: as for rt(); the area is registered with the host, which reads and writes it only
    // around export calls (docs/abi.md, "The output area").
    unsafe { std::slice::from_raw_parts_mut(std::ptr::addr_of_mut!(AREA) as *mut u8, AREA_SIZE) }
}

fn die(msg: &str) -> ! {
    log(Level::Error, msg);
    std::process::abort()
}

fn valid_name(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c == b'-')
}

fn declare(kind: &str, list: &mut Vec<&'static str>, name: &'static str, max: usize) -> u32 {
    if rt().sealed {
        die(&format!("clink: {} {:?} declared after initialisation: declare it in the operator's constructor", kind, name));
    }
    if !valid_name(name, 128) {
        die(&format!("clink: invalid {} name {:?}: want 1-128 characters of [A-Za-z0-9_.-]", kind, name));
    }
    if list.contains(&name) {
        die(&format!("clink: {} {:?} declared twice", kind, name));
    }
    if list.len() == max {
        die(&format!("clink: more than {} {}s", max, kind));
    }
    list.push(name);
    (list.len() - 1) as u32
}

/// The registered operator's name.
pub fn name() -> &'static str {
    rt().name
}

// ---- State ----

/// A named keyed state: a map from entry (state key) to value, one map per record key. Inside a
/// call for record key K, every method reads or writes K's map only; use the empty entry for a
/// plain per-key value. Allowed in `process` and `on_timer` (`NOT_ALLOWED` elsewhere).
///
/// A state declared with [`PREFETCH`] has its per-key value (the empty entry) delivered with
/// every record and timer in a frame of the input buffer; reads and writes of the empty entry
/// then make no import call, and the host writes a changed value back when the call returns. A
/// value larger than the frame goes through the put import, and the reads that follow in the
/// same call go through `get_async` until the entry is written again, so a call always reads
/// what it wrote.
#[derive(Clone, Copy, Debug)]
pub struct State {
    name: &'static str,
    index: u32,
    slot: Option<usize>,
}

impl State {
    /// Declares a state (1-128 characters of `[A-Za-z0-9_.-]`, unique; at most 256, 16 of them
    /// prefetched). Only while the operator is being constructed: a late, invalid or duplicate
    /// declaration logs the reason and aborts the instance.
    pub fn new(name: &'static str, flags: u32) -> State {
        let r = rt();
        let index = declare("state", &mut r.states, name, MAX_STATES);
        let mut slot = None;
        if flags & PREFETCH != 0 {
            if r.prefetched.len() == MAX_PREFETCH {
                die(&format!("clink: more than 16 prefetched states (State::new({:?}, PREFETCH))", name));
            }
            r.prefetched.push(name);
            r.frames.push(Frame { frame: -1, stale: false });
            slot = Some(r.prefetched.len() - 1);
        }
        State { name, index, slot }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn prefetched(&self) -> bool {
        self.slot.is_some()
    }

    /// The frame of this state for the current call, if the empty entry is served by it.
    fn frame(&self, entry: &[u8], for_read: bool) -> Option<usize> {
        let slot = self.slot?;
        let f = rt().frames[slot];
        if !entry.is_empty() || f.frame < 0 || (for_read && f.stale) {
            return None;
        }
        Some(f.frame as usize)
    }

    /// Appends the value of `entry` to `dst`; returns whether it was found (`dst` is unchanged
    /// otherwise). May suspend while the host loads a cold value; the operator does not see it.
    pub fn get_into(&self, entry: &[u8], dst: &mut Vec<u8>) -> Result<bool> {
        if let Some(off) = self.frame(entry, true) {
            let input = &rt().input;
            let n = le32(&input[off..]);
            if n == FRAME_ABSENT {
                return Ok(false);
            }
            dst.extend_from_slice(&input[off + FRAME_HEADER..off + FRAME_HEADER + n as usize]);
            return Ok(true);
        }
        if dst.capacity() - dst.len() < 64 {
            dst.reserve(256);
        }
        let len = dst.len();
        let spare = (dst.capacity() - len) as u32;
        // SAFETY: the host writes at most `spare` bytes into the spare capacity.
        let n = unsafe { sys::get_async(self.index, entry.as_ptr(), entry.len() as u32, dst.as_mut_ptr().add(len), spare) };
        if n == Code::NOT_FOUND.0 {
            return Ok(false);
        }
        check("get", n)?;
        if n as u32 <= spare {
            // SAFETY: the host wrote n bytes there.
            unsafe { dst.set_len(len + n as usize) };
            return Ok(true);
        }
        fetch("get", dst, n as usize)?;
        Ok(true)
    }

    /// The value of `entry`, or None when it is absent.
    pub fn get(&self, entry: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut v = Vec::new();
        Ok(if self.get_into(entry, &mut v)? { Some(v) } else { None })
    }

    /// Whether `entry` exists.
    pub fn has(&self, entry: &[u8]) -> Result<bool> {
        if let Some(off) = self.frame(entry, true) {
            return Ok(le32(&rt().input[off..]) != FRAME_ABSENT);
        }
        let r = rt();
        let mut buf = std::mem::take(&mut r.result);
        buf.clear();
        let found = self.get_into(entry, &mut buf);
        rt().result = buf;
        found
    }

    /// Reads an entry written by `put_i64` (8 bytes, little-endian); None when absent. A value
    /// of another length is an `INVALID_ARGUMENT` error.
    pub fn get_i64(&self, entry: &[u8]) -> Result<Option<i64>> {
        let decode = |v: &[u8]| -> Result<i64> {
            if v.len() != 8 {
                return Err(Error::Code { op: "get int64", code: Code::INVALID_ARGUMENT });
            }
            Ok(i64_decode(v))
        };
        if let Some(off) = self.frame(entry, true) {
            let input = &rt().input;
            let n = le32(&input[off..]);
            if n == FRAME_ABSENT {
                return Ok(None);
            }
            return decode(&input[off + FRAME_HEADER..off + FRAME_HEADER + n as usize]).map(Some);
        }
        let mut buf = std::mem::take(&mut rt().result);
        buf.clear();
        let got = self.get_into(entry, &mut buf);
        let out = match got {
            Ok(true) => decode(&buf).map(Some),
            Ok(false) => Ok(None),
            Err(e) => Err(e),
        };
        rt().result = buf;
        out
    }

    /// Sets `entry` to a copy of `value`. An empty value is a value, not a delete.
    pub fn put(&self, entry: &[u8], value: &[u8]) -> Result<()> {
        if let Some(off) = self.frame(entry, false) {
            let slot = self.slot.unwrap();
            let r = rt();
            let cap = le32(&r.input[off + 4..]) as usize;
            if value.len() <= cap {
                write_frame(&mut r.input[off..], Some(value));
                r.frames[slot].stale = false;
                return Ok(());
            }
            // Larger than the frame: through put, and the frame must stay un-DIRTY, or the
            // write-back would overwrite the put. A failed put changes nothing.
            check("put", unsafe { sys::put(self.index, std::ptr::null(), 0, value.as_ptr(), value.len() as u32) })?;
            let h = &mut r.input[off..];
            let flags = le32(&h[8..]) & !FRAME_DIRTY;
            put_le32(&mut h[8..], flags);
            r.frames[slot].stale = true;
            return Ok(());
        }
        check("put", unsafe { sys::put(self.index, entry.as_ptr(), entry.len() as u32, value.as_ptr(), value.len() as u32) })
    }

    /// Removes `entry`; deleting an absent entry succeeds.
    pub fn delete(&self, entry: &[u8]) -> Result<()> {
        if let Some(off) = self.frame(entry, false) {
            let r = rt();
            write_frame(&mut r.input[off..], None);
            r.frames[self.slot.unwrap()].stale = false;
            return Ok(());
        }
        check("delete", unsafe { sys::delete(self.index, entry.as_ptr(), entry.len() as u32) })
    }

    /// Writes `v` as 8 bytes, little-endian.
    pub fn put_i64(&self, entry: &[u8], v: i64) -> Result<()> {
        self.put(entry, &v.to_le_bytes())
    }
}

/// Sets a frame's value (None deletes the entry) and marks it DIRTY.
fn write_frame(h: &mut [u8], value: Option<&[u8]>) {
    match value {
        Some(v) => {
            h[FRAME_HEADER..FRAME_HEADER + v.len()].copy_from_slice(v);
            put_le32(h, v.len() as u32);
        }
        None => put_le32(h, FRAME_ABSENT),
    }
    let flags = le32(&h[8..]) | FRAME_DIRTY;
    put_le32(&mut h[8..], flags);
}

/// Completes a read whose value did not fit: takes the pending result (n bytes) into dst.
fn fetch(op: &'static str, dst: &mut Vec<u8>, n: usize) -> Result<()> {
    dst.reserve(n);
    let len = dst.len();
    // SAFETY: the host writes at most the spare capacity.
    let rc = unsafe { sys::take_result(dst.as_mut_ptr().add(len), (dst.capacity() - len) as u32) };
    check(op, rc)?;
    unsafe { dst.set_len(len + rc as usize) };
    Ok(())
}

/// Decodes 8 bytes, little-endian (the state layout of `put_i64`).
pub fn i64_decode(b: &[u8]) -> i64 {
    i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Locates the prefetched states' frames from offset `off` and checks what the host wrote. A
/// malformed frame most likely means a host that does not know the manifest's prefetch field.
fn load_frames(mut off: usize) -> Result<()> {
    let r = rt();
    for i in 0..r.prefetched.len() {
        let what = if off + FRAME_HEADER > r.input.len() {
            "its frame lies outside the input buffer"
        } else {
            let n = le32(&r.input[off..]);
            let c = le32(&r.input[off + 4..]);
            if c < FRAME_MIN_CAP || c % 8 != 0 || off + FRAME_HEADER + c as usize > r.input.len() {
                "its frame has an invalid cap"
            } else if n != FRAME_ABSENT && n != FRAME_TOO_LARGE && n > c {
                "its frame has len > cap"
            } else {
                r.frames[i] = Frame { frame: off as i64, stale: n == FRAME_TOO_LARGE };
                off += FRAME_HEADER + c as usize;
                continue;
            }
        };
        return Err(Error::Message(format!(
            "clink: prefetched state {:?}: {} (does the host support the manifest's prefetch field? docs/abi.md, \"Prefetched values\")",
            r.prefetched[i], what
        )));
    }
    Ok(())
}

fn end_call() {
    let r = rt();
    r.emitting = false;
    for f in r.frames.iter_mut() {
        f.frame = -1;
    }
}

// ---- Lookup ----

/// A named HTTP lookup endpoint. The pipeline defines it (base URL, secrets, limits); the module
/// names it and requests paths below it.
#[derive(Clone, Copy, Debug)]
pub struct Endpoint {
    name: &'static str,
    index: u32,
}

/// A lookup response: the status (a non-2xx status is a response, not an error) and the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: i32,
    pub body: Vec<u8>,
}

fn safe_line(s: &str) -> bool {
    !s.contains('\n') && !s.contains('\r')
}

impl Endpoint {
    /// Declares an endpoint (1-128 characters of `[A-Za-z0-9_.-]`, unique, at most 64), only
    /// while the operator is being constructed.
    pub fn new(name: &'static str) -> Endpoint {
        let index = declare("endpoint", &mut rt().endpoints, name, MAX_ENDPOINTS);
        Endpoint { name, index }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Sends an HTTP request and waits for the response (docs/abi.md, "Lookup request
    /// format"). `path` starts with "/" and is appended to the endpoint's base path. A method,
    /// path or header with a line break is refused here, as `LOOKUP_REFUSED`. May suspend.
    pub fn lookup(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<Response> {
        let refused = Err(Error::Code { op: "lookup", code: Code::LOOKUP_REFUSED });
        if !safe_line(method) || !safe_line(path) {
            return refused;
        }
        let r = rt();
        let mut req = std::mem::take(&mut r.request);
        req.clear();
        req.extend_from_slice(method.as_bytes());
        req.push(b' ');
        req.extend_from_slice(path.as_bytes());
        req.push(b'\n');
        for (n, v) in headers {
            if n.is_empty() || !safe_line(n) || n.contains(':') || !safe_line(v) {
                rt().request = req;
                return refused;
            }
            req.extend_from_slice(n.as_bytes());
            req.extend_from_slice(b": ");
            req.extend_from_slice(v.as_bytes());
            req.push(b'\n');
        }
        if !body.is_empty() {
            req.push(b'\n');
            req.extend_from_slice(body);
        }
        let mut out: Vec<u8> = Vec::with_capacity(512);
        let packed = unsafe { sys::lookup(self.index, req.as_ptr(), req.len() as u32, out.as_mut_ptr(), out.capacity() as u32) };
        if req.capacity() > 1 << 20 {
            req = Vec::new(); // do not pin a huge request buffer
        }
        rt().request = req;
        if packed < 0 {
            return Err(Error::Code { op: "lookup", code: Code(packed as i32) });
        }
        let (status, n) = ((packed >> 32) as i32, packed as u32 as usize);
        if n <= out.capacity() {
            unsafe { out.set_len(n) };
        } else {
            fetch("lookup", &mut out, n)?;
        }
        Ok(Response { status, body: out })
    }
}

// ---- Emit: the output area (docs/abi.md, "The output area") ----

fn append_record(used: usize, key: &[u8], value: &[u8]) {
    let a = area();
    let p = 4 + used;
    put_le32(&mut a[p..], key.len() as u32);
    put_le32(&mut a[p + 4..], value.len() as u32);
    a[p + 8..p + 8 + key.len()].copy_from_slice(key);
    a[p + 8 + key.len()..p + 8 + key.len() + value.len()].copy_from_slice(value);
    put_le32(a, (used + 8 + key.len() + value.len()) as u32);
}

/// Emits an output record, stamped with the timestamp of the record or timer being processed.
/// Allowed in `process`, `on_timer` and `close`. Records are buffered in the output area and
/// delivered in order when the call returns.
pub fn emit(key: &[u8], value: &[u8]) -> Result<()> {
    let r = rt();
    if r.emitting {
        if r.area_state == 0 {
            let a = area();
            r.area_state = if unsafe { sys::output_area(a.as_mut_ptr(), AREA_SIZE as u32) } < 0 { -1 } else { 1 };
        }
        if r.area_state > 0 {
            let need = 8 + key.len() + value.len();
            let used = le32(area()) as usize;
            if 4 + used + need <= AREA_SIZE {
                append_record(used, key, value);
                return Ok(());
            }
            if used > 0 {
                check("emit: flush_output", unsafe { sys::flush_output() })?;
            }
            if 4 + need <= AREA_SIZE {
                append_record(0, key, value);
                return Ok(());
            }
            // Larger than the area: the area is empty now, so the import keeps the order.
        }
    }
    check("emit", unsafe { sys::emit(key.as_ptr(), key.len() as u32, value.as_ptr(), value.len() as u32) })
}

// ---- Timers, time, logs ----

/// Registers an event-time timer for the current key (`process` and `on_timer` only, and only
/// for an operator whose `handles_timers` is true).
pub fn register_timer(timestamp: i64) -> Result<()> {
    match rt().op.as_ref() {
        Some(op) if op.handles_timers() => {}
        _ => return Err(Error::Code { op: "register timer", code: Code::NOT_ALLOWED }),
    }
    check("register timer", unsafe { sys::timer_register(timestamp) })
}

/// Deletes the current key's timer at `timestamp`; deleting an absent timer succeeds.
pub fn delete_timer(timestamp: i64) -> Result<()> {
    check("delete timer", unsafe { sys::timer_delete(timestamp) })
}

/// The current event-time watermark (ms).
pub fn watermark() -> i64 {
    unsafe { sys::watermark() }
}

/// Wall-clock time in ms since the Unix epoch.
pub fn processing_time() -> i64 {
    unsafe { sys::processing_time() }
}

/// Gives the current call's next suspensions a priority (lower resumes first).
pub fn set_resume_order(order: i64) {
    unsafe { sys::set_resume_order(order) }
}

/// Writes msg to the operator's log. The last error-level message of a failing call is attached
/// to the host's report.
pub fn log(level: Level, msg: &str) {
    unsafe { sys::log(level as i32, msg.as_ptr(), msg.len() as u32) }
}

/// `log` with `format!` arguments: `clink::logf!(clink::Level::Info, "n = {}", n)`.
#[macro_export]
macro_rules! logf {
    ($level:expr, $($arg:tt)*) => { $crate::log($level, &format!($($arg)*)) };
}

// ---- JSON ----

/// A small JSON toolkit that behaves exactly like the Go SDK's jsonx and the AssemblyScript
/// SDK's json module, so that operators in every language produce byte-identical output.
pub mod json {
    fn is_space(c: u8) -> bool {
        c == b' ' || c == b'\t' || c == b'\n' || c == b'\r'
    }

    fn skip_space(b: &[u8], mut i: usize) -> usize {
        while i < b.len() && is_space(b[i]) {
            i += 1;
        }
        i
    }

    fn skip_string(b: &[u8], mut i: usize) -> Option<usize> {
        i += 1;
        while i < b.len() {
            match b[i] {
                b'\\' => i += 1,
                b'"' => return Some(i + 1),
                _ => {}
            }
            i += 1;
        }
        None
    }

    fn skip_value(b: &[u8], mut i: usize) -> Option<usize> {
        match *b.get(i)? {
            b'"' => skip_string(b, i),
            b'{' | b'[' => {
                let mut depth = 0;
                while i < b.len() {
                    match b[i] {
                        b'"' => {
                            i = skip_string(b, i)?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some(i + 1);
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                None
            }
            b',' | b':' | b'}' | b']' => None,
            _ => {
                let start = i;
                while i < b.len() && !is_space(b[i]) && b[i] != b',' && b[i] != b'}' && b[i] != b']' {
                    i += 1;
                }
                if i == start {
                    None
                } else {
                    Some(i)
                }
            }
        }
    }

    /// The raw JSON text of the first top-level field called `name` (raw names compared; a
    /// string value includes its quotes), or None.
    pub fn field<'a>(obj: &'a [u8], name: &str) -> Option<&'a [u8]> {
        let mut i = skip_space(obj, 0);
        if *obj.get(i)? != b'{' {
            return None;
        }
        i += 1;
        loop {
            i = skip_space(obj, i);
            if *obj.get(i)? != b'"' {
                return None;
            }
            let end = skip_string(obj, i)?;
            let matched = &obj[i + 1..end - 1] == name.as_bytes();
            i = skip_space(obj, end);
            if *obj.get(i)? != b':' {
                return None;
            }
            i = skip_space(obj, i + 1);
            let vend = skip_value(obj, i)?;
            if matched {
                return Some(&obj[i..vend]);
            }
            i = skip_space(obj, vend);
            if *obj.get(i)? != b',' {
                return None;
            }
            i += 1;
        }
    }

    /// Parses a JSON integer, `-?(0|[1-9][0-9]*)` within i64.
    pub fn parse_int(raw: &[u8]) -> Option<i64> {
        let (neg, mut i) = if raw.first() == Some(&b'-') { (true, 1) } else { (false, 0) };
        if i >= raw.len() || (raw[i] == b'0' && raw.len() > i + 1) {
            return None;
        }
        // Accumulate as a negative number: its range includes i64::MIN.
        let mut n: i64 = 0;
        while i < raw.len() {
            let c = raw[i];
            if !c.is_ascii_digit() {
                return None;
            }
            let d = (c - b'0') as i64;
            if n < (i64::MIN + d) / 10 {
                return None;
            }
            n = n * 10 - d;
            i += 1;
        }
        if !neg {
            if n == i64::MIN {
                return None;
            }
            n = -n;
        }
        Some(n)
    }

    /// `field` followed by `parse_int`.
    pub fn field_int(obj: &[u8], name: &str) -> Option<i64> {
        parse_int(field(obj, name)?)
    }

    /// Appends `s` as a JSON string, quotes included: escapes '"', '\\' and the control
    /// characters (as \b \t \n \f \r, otherwise \u00XX), copies every other byte as is.
    pub fn append_string(dst: &mut Vec<u8>, s: &[u8]) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        dst.push(b'"');
        let mut start = 0;
        for (i, &c) in s.iter().enumerate() {
            if c >= 0x20 && c != b'"' && c != b'\\' {
                continue;
            }
            dst.extend_from_slice(&s[start..i]);
            match c {
                b'"' | b'\\' => dst.extend_from_slice(&[b'\\', c]),
                0x08 => dst.extend_from_slice(b"\\b"),
                b'\t' => dst.extend_from_slice(b"\\t"),
                b'\n' => dst.extend_from_slice(b"\\n"),
                0x0c => dst.extend_from_slice(b"\\f"),
                b'\r' => dst.extend_from_slice(b"\\r"),
                _ => dst.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[(c >> 4) as usize], HEX[(c & 15) as usize]]),
            }
            start = i + 1;
        }
        dst.extend_from_slice(&s[start..]);
        dst.push(b'"');
    }

    /// Appends `v` in decimal, without allocating (the hot path of most operators).
    pub fn append_int(dst: &mut Vec<u8>, v: i64) {
        let mut tmp = [0u8; 20];
        let mut i = tmp.len();
        // Work on the negative value: its range includes i64::MIN.
        let mut n = if v < 0 { v } else { -v };
        loop {
            i -= 1;
            tmp[i] = b'0' + (-(n % 10)) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        if v < 0 {
            dst.push(b'-');
        }
        dst.extend_from_slice(&tmp[i..]);
    }

    fn hex4(s: &[u8], i: usize) -> Option<u32> {
        let h = s.get(i..i + 4)?;
        let mut r = 0u32;
        for &c in h {
            r = r << 4 | (c as char).to_digit(16)?;
        }
        Some(r)
    }

    /// Appends the decoded text of the JSON string `raw` (quotes included, as `field` returns
    /// it); false if `raw` is not a well-formed JSON string. A lone surrogate decodes to
    /// U+FFFD; bytes that are not valid UTF-8 are copied as they are.
    pub fn unquote(dst: &mut Vec<u8>, raw: &[u8]) -> bool {
        if raw.len() < 2 || raw[0] != b'"' || raw[raw.len() - 1] != b'"' {
            return false;
        }
        let s = &raw[1..raw.len() - 1];
        let mut i = 0;
        while i < s.len() {
            let c = s[i];
            if c == b'"' || c < 0x20 {
                return false;
            }
            if c != b'\\' {
                dst.push(c);
                i += 1;
                continue;
            }
            i += 1;
            if i == s.len() {
                return false;
            }
            match s[i] {
                b'"' | b'\\' | b'/' => dst.push(s[i]),
                b'b' => dst.push(0x08),
                b'f' => dst.push(0x0c),
                b'n' => dst.push(b'\n'),
                b'r' => dst.push(b'\r'),
                b't' => dst.push(b'\t'),
                b'u' => {
                    let mut r = match hex4(s, i + 1) {
                        Some(r) => r,
                        None => return false,
                    };
                    i += 4;
                    if (0xD800..0xDC00).contains(&r) {
                        // A high surrogate: combine with a following \uDC00-\uDFFF escape.
                        let low = if i + 6 < s.len() && s[i + 1] == b'\\' && s[i + 2] == b'u' { hex4(s, i + 3) } else { None };
                        match low {
                            Some(r2) if (0xDC00..0xE000).contains(&r2) => {
                                r = 0x10000 + ((r - 0xD800) << 10) + (r2 - 0xDC00);
                                i += 6;
                            }
                            _ => r = 0xFFFD,
                        }
                    } else if (0xDC00..0xE000).contains(&r) {
                        r = 0xFFFD;
                    }
                    let ch = char::from_u32(r).unwrap_or('\u{FFFD}');
                    let mut b = [0u8; 4];
                    dst.extend_from_slice(ch.encode_utf8(&mut b).as_bytes());
                }
                _ => return false,
            }
            i += 1;
        }
        true
    }
}

// ---- The runtime behind the exports (called by export_operator!) ----

#[doc(hidden)]
pub mod __rt {
    use super::*;

    /// Runs the operator's constructor once per instance, then builds the manifest.
    pub fn ensure(make: fn() -> Box<dyn Operator>, op_name: &'static str) {
        let r = rt();
        if r.op.is_some() {
            return;
        }
        if !valid_name(op_name, 64) {
            die(&format!("clink: invalid operator name {:?}: want 1-64 characters of [A-Za-z0-9_.-]", op_name));
        }
        r.name = op_name;
        let op = make();
        let r = rt();
        r.op = Some(op);
        r.sealed = true;
        let mut b = format!("{{\"abi\":1,\"name\":\"{}\",\"states\":[", op_name).into_bytes();
        let list = |b: &mut Vec<u8>, names: &[&str]| {
            for (i, n) in names.iter().enumerate() {
                if i > 0 {
                    b.push(b',');
                }
                b.push(b'"');
                b.extend_from_slice(n.as_bytes());
                b.push(b'"');
            }
        };
        list(&mut b, &r.states);
        if !r.prefetched.is_empty() {
            b.extend_from_slice(b"],\"prefetch\":[");
            list(&mut b, &r.prefetched);
        }
        b.extend_from_slice(b"],\"endpoints\":[");
        list(&mut b, &r.endpoints);
        b.extend_from_slice(b"]}");
        r.manifest = b;
    }

    /// A callback's result as the export's return value; an error's text is logged at error
    /// level, so that it is the message of the host's fault report.
    fn result(res: Result<()>) -> i32 {
        match res {
            Ok(()) => 0,
            Err(e) => {
                log(Level::Error, &e.to_string());
                1
            }
        }
    }

    fn op() -> &'static mut dyn Operator {
        match rt().op.as_mut() {
            Some(op) => op.as_mut(),
            None => die("clink: no operator"),
        }
    }

    pub fn input(cap: u32) -> *mut u8 {
        if cap > MAX_INPUT {
            return std::ptr::null_mut();
        }
        let cap = cap.max(1) as usize;
        let r = rt();
        if cap > r.input.len() {
            let mut v = Vec::new();
            if v.try_reserve_exact(cap).is_err() {
                return std::ptr::null_mut();
            }
            v.resize(cap, 0);
            r.input = v;
        }
        r.input.as_mut_ptr()
    }

    pub fn process(key_len: u32, value_len: u32, timestamp: i64) -> i32 {
        let r = rt();
        let end = key_len as usize + value_len as usize;
        if !r.prefetched.is_empty() {
            if let Err(e) = load_frames((end + 7) & !7) {
                end_call();
                return result(Err(e));
            }
        }
        r.emitting = true;
        // SAFETY: the input buffer is not reallocated during the call (only clink_input does
        // that, and the host never calls it during another export call); frames after `end`
        // are written through rt().input, which this record does not overlap.
        let input: &[u8] = unsafe { std::slice::from_raw_parts(r.input.as_ptr(), end) };
        let rec = Record { key: &input[..key_len as usize], value: &input[key_len as usize..end], timestamp };
        let res = op().process(&rec);
        end_call();
        result(res)
    }

    pub fn on_timer(key_len: u32, timestamp: i64) -> i32 {
        let r = rt();
        if !r.prefetched.is_empty() {
            if let Err(e) = load_frames((key_len as usize + 7) & !7) {
                end_call();
                return result(Err(e));
            }
        }
        r.emitting = true;
        let key: &[u8] = unsafe { std::slice::from_raw_parts(r.input.as_ptr(), key_len as usize) };
        let res = op().on_timer(key, timestamp);
        end_call();
        result(res)
    }

    pub fn open() -> i32 {
        result(op().open())
    }

    pub fn close() -> i32 {
        rt().emitting = true;
        let res = op().close();
        rt().emitting = false;
        result(res)
    }

    pub fn manifest() -> u64 {
        let m = &rt().manifest;
        (m.as_ptr() as usize as u64) << 32 | m.len() as u64
    }

    pub fn key(value_len: u32, f: fn(&[u8]) -> Option<&[u8]>) -> i64 {
        let r = rt();
        let value: &[u8] = unsafe { std::slice::from_raw_parts(r.input.as_ptr(), value_len as usize) };
        match f(value) {
            Some(k) => ((k.as_ptr() as usize as u64) << 32 | k.len() as u64) as i64,
            None => -1,
        }
    }
}

/// Defines the module's exports for an operator: `export_operator!("name", constructor)`, where
/// `constructor` is a `fn() -> impl Operator` (a closure without captures works) that declares
/// the operator's states and endpoints. The SDK runs it once per instance, at the first export
/// call, before anything else.
#[macro_export]
macro_rules! export_operator {
    ($name:expr, $make:expr) => {
        fn __clink_make() -> ::std::boxed::Box<dyn $crate::Operator> {
            ::std::boxed::Box::new(($make)())
        }
        fn __clink_ensure() {
            $crate::__rt::ensure(__clink_make, $name)
        }
        #[no_mangle]
        pub extern "C" fn clink_input(cap: u32) -> *mut u8 {
            __clink_ensure();
            $crate::__rt::input(cap)
        }
        #[no_mangle]
        pub extern "C" fn clink_process(key_len: u32, value_len: u32, timestamp: i64) -> i32 {
            __clink_ensure();
            $crate::__rt::process(key_len, value_len, timestamp)
        }
        #[no_mangle]
        pub extern "C" fn clink_on_timer(key_len: u32, timestamp: i64) -> i32 {
            __clink_ensure();
            $crate::__rt::on_timer(key_len, timestamp)
        }
        #[no_mangle]
        pub extern "C" fn clink_open() -> i32 {
            __clink_ensure();
            $crate::__rt::open()
        }
        #[no_mangle]
        pub extern "C" fn clink_close() -> i32 {
            __clink_ensure();
            $crate::__rt::close()
        }
        #[no_mangle]
        pub extern "C" fn clink_manifest() -> u64 {
            __clink_ensure();
            $crate::__rt::manifest()
        }
    };
}

/// Exports `clink_key`, the optional key function: `export_key_function!(f)` with
/// `f: fn(&[u8]) -> Option<&[u8]>` returning the record's key (None rejects the record as
/// malformed). The key may point into the value, or into a `static` buffer of the operator's.
/// Only modules that call this export `clink_key`: the key function is a capability.
#[macro_export]
macro_rules! export_key_function {
    ($f:expr) => {
        #[no_mangle]
        pub extern "C" fn clink_key(value_len: u32) -> i64 {
            $crate::__rt::key(value_len, $f)
        }
    };
}
