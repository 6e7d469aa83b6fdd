//! Exercises every part of the Rust SDK inside a real wasm module. The record value is a
//! command; guest-sdk/sdktest runs the same script against this module and the Go,
//! AssemblyScript and C ones and expects the same output from all of them.
use clink::{json, Code, Endpoint, Error, Level, Operator, Record, Response, State};

struct Conformance {
    kv: State,
    dict: State,
    big: State,
    echo: Endpoint,
    pf: State,
    pf2: State,
    out: Vec<u8>,
    tmp: Vec<u8>,
}

fn parse(s: &str) -> i64 {
    json::parse_int(s.as_bytes()).unwrap_or(0)
}

/// A failed SDK call fails the record with the code's name as its message, as the other
/// conformance modules do.
fn check<T>(r: clink::Result<T>) -> clink::Result<T> {
    r.map_err(|e| match e.code() {
        Some(c) => Error::Message(c.name().to_string()),
        None => e,
    })
}

impl Conformance {
    fn emit_out(&self, r: &Record) -> clink::Result<()> {
        clink::emit(r.key, &self.out)
    }

    fn lookup_result(&mut self, r: &Record, res: clink::Result<Response>) -> clink::Result<()> {
        let o = &mut self.out;
        o.clear();
        match res {
            Err(e) => {
                let c = e.code().unwrap_or(Code(0));
                o.extend_from_slice(b"{\"error\":\"");
                o.extend_from_slice(c.name().as_bytes());
                o.extend_from_slice(if c.retryable() { b"\",\"retryable\":true}" } else { b"\",\"retryable\":false}" });
            }
            Ok(resp) => {
                o.extend_from_slice(b"{\"status\":");
                json::append_int(o, resp.status as i64);
                o.extend_from_slice(b",\"body\":");
                json::append_string(o, &resp.body);
                o.push(b'}');
            }
        }
        self.emit_out(r)
    }

    /// Emits {"get":V} for pf's value, or {"get":null}.
    fn emit_get(&mut self, r: &Record) -> clink::Result<()> {
        match check(self.pf.get(b""))? {
            None => clink::emit(r.key, b"{\"get\":null}"),
            Some(v) => {
                self.out.clear();
                self.out.extend_from_slice(b"{\"get\":");
                json::append_string(&mut self.out, &v);
                self.out.push(b'}');
                self.emit_out(r)
            }
        }
    }

    /// A JSON string of size bytes that starts with i: "17     ".
    fn padded(&mut self, i: i64, size: usize) {
        let t = &mut self.tmp;
        t.clear();
        t.push(b'"');
        json::append_int(t, i);
        while t.len() < size.saturating_sub(1) {
            t.push(b' ');
        }
        t.push(b'"');
    }

    fn obj(&mut self, parts: &[(&str, &[u8])]) {
        self.out.clear();
        self.out.push(b'{');
        for (i, (k, v)) in parts.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            json::append_string(&mut self.out, k.as_bytes());
            self.out.push(b':');
            self.out.extend_from_slice(v);
        }
        self.out.push(b'}');
    }
}

fn int(v: i64) -> Vec<u8> {
    v.to_string().into_bytes()
}

fn string(v: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    json::append_string(&mut b, v);
    b
}

impl Operator for Conformance {
    fn handles_timers(&self) -> bool {
        true
    }

    fn open(&mut self) -> clink::Result<()> {
        let na = |r: clink::Result<()>| r.err().and_then(|e| e.code()) == Some(Code::NOT_ALLOWED);
        if na(self.kv.put(b"", b"x")) {
            clink::log(Level::Info, "open: put NOT_ALLOWED");
        }
        if na(clink::emit(b"", b"1")) {
            clink::log(Level::Info, "open: emit NOT_ALLOWED");
        }
        if na(self.pf.put(b"", b"x")) {
            clink::log(Level::Info, "open: prefetched put NOT_ALLOWED");
        }
        Ok(())
    }

    fn close(&mut self) -> clink::Result<()> {
        clink::emit(b"", b"{\"closed\":true}")
    }

    fn on_timer(&mut self, key: &[u8], ts: i64) -> clink::Result<()> {
        let mut o = b"{\"timer\":".to_vec();
        json::append_int(&mut o, ts);
        o.extend_from_slice(b",\"key\":");
        json::append_string(&mut o, key);
        // A timer gets its key's frames too: read pf2, write pf2+timestamp back.
        if let Some(n) = check(self.pf2.get_i64(b""))? {
            check(self.pf2.put_i64(b"", n + ts))?;
            o.extend_from_slice(b",\"pf2\":");
            json::append_int(&mut o, n);
        }
        o.push(b'}');
        clink::emit(key, &o)
    }

    fn process(&mut self, r: &Record) -> clink::Result<()> {
        let text = String::from_utf8_lossy(r.value).into_owned();
        let (cmd, arg) = match text.find(' ') {
            Some(i) => (&text[..i], &text[i + 1..]),
            None => (&text[..], ""),
        };
        match cmd {
            "count" => {
                let n = check(self.kv.get_i64(b""))?.unwrap_or(0) + 1;
                check(self.kv.put_i64(b"", n))?;
                self.obj(&[("count", &int(n))]);
                self.emit_out(r)
            }
            "put" => {
                let eq = arg.find('=').ok_or("put: want K=V")?;
                check(self.dict.put(arg[..eq].as_bytes(), arg[eq + 1..].as_bytes()))
            }
            "get" => match check(self.dict.get(arg.as_bytes()))? {
                None => clink::emit(r.key, b"{\"get\":null}"),
                Some(v) => {
                    self.obj(&[("get", &string(&v))]);
                    self.emit_out(r)
                }
            },
            "del" => check(self.dict.delete(arg.as_bytes())),
            "big" => {
                let n = parse(arg) as usize;
                let val: Vec<u8> = (0..n).map(|i| b'a' + (i % 7) as u8).collect();
                check(self.big.put(b"e", &val))?;
                let got = check(self.big.get(b"e"))?;
                if got.as_deref() != Some(&val[..]) {
                    return Err("big: get returned something else".into());
                }
                let mut mine = Vec::new();
                if !check(self.big.get_into(b"e", &mut mine))? || mine != val {
                    return Err("big: get_into returned something else".into());
                }
                self.obj(&[("big", &int(val.len() as i64))]);
                self.emit_out(r)
            }
            "has" => {
                let has = check(self.big.has(b"e"))?;
                clink::emit(r.key, if has { b"{\"has\":true}" } else { b"{\"has\":false}" })
            }
            "timer" => check(clink::register_timer(parse(arg))),
            "deltimer" => check(clink::delete_timer(parse(arg))),
            "lookup" => {
                let res = self.echo.lookup("GET", arg, &[("X-Test", "1")], b"");
                self.lookup_result(r, res)
            }
            "post" => {
                let res = self.echo.lookup("POST", "/echo", &[], arg.as_bytes());
                self.lookup_result(r, res)
            }
            "inject" => {
                let res = self.echo.lookup("GET", "/x\nHost: evil", &[], b"");
                self.lookup_result(r, res)
            }
            "hot" => {
                let n = check(self.kv.get_i64(b"hot"))?.unwrap_or(0) + 1;
                check(self.kv.put_i64(b"hot", n))?;
                self.obj(&[("key", &string(r.key)), ("hot", &int(n))]);
                self.emit_out(r)
            }
            "phot" => {
                // The counter example's hot path on a prefetched state: no import call.
                let n = check(self.pf2.get_i64(b""))?.unwrap_or(0) + 1;
                check(self.pf2.put_i64(b"", n))?;
                self.obj(&[("key", &string(r.key)), ("phot", &int(n))]);
                self.emit_out(r)
            }
            "pcount" => {
                let n = check(self.pf.get_i64(b""))?.unwrap_or(0) + 1;
                check(self.pf.put_i64(b"", n))?;
                let m = check(self.pf2.get_i64(b""))?.unwrap_or(0) + 10;
                check(self.pf2.put_i64(b"", m))?;
                self.obj(&[("pf", &int(n)), ("pf2", &int(m))]);
                self.emit_out(r)
            }
            "pget" => self.emit_get(r),
            "phas" => {
                let has = check(self.pf.has(b""))?;
                clink::emit(r.key, if has { b"{\"has\":true}" } else { b"{\"has\":false}" })
            }
            "pputs" => {
                // Each space-separated value in turn: write it, read it back.
                for part in arg.split(' ') {
                    check(self.pf.put(b"", part.as_bytes()))?;
                    self.emit_get(r)?;
                }
                Ok(())
            }
            "pdel" => {
                check(self.pf.delete(b""))?;
                self.emit_get(r)
            }
            "pputdel" => {
                // Write (maybe larger than the frame), then delete, in one call.
                check(self.pf.put(b"", arg.as_bytes()))?;
                check(self.pf.delete(b""))?;
                self.emit_get(r)
            }
            "pentry" => {
                // Another entry of a prefetched state: through the imports.
                check(self.pf.put(b"x", arg.as_bytes()))?;
                let v = check(self.pf.get(b"x"))?.unwrap_or_default();
                self.obj(&[("entry", &string(&v))]);
                self.emit_out(r)
            }
            "pint" => {
                let n = check(self.pf.get_i64(b""))?.unwrap_or(0);
                self.obj(&[("int", &int(n))]);
                self.emit_out(r)
            }
            "pfail" => {
                // Write and emit, then fail: neither may reach the host.
                check(self.pf.put(b"", arg.as_bytes()))?;
                clink::emit(r.key, b"{\"before\":true}")?;
                Err("failed on purpose after a write".into())
            }
            "emitmany" => {
                let (n, size) = arg.split_once(' ').ok_or("emitmany: want N SIZE")?;
                for i in 0..parse(n) {
                    self.padded(i, parse(size) as usize);
                    check(clink::emit(r.key, &self.tmp))?;
                }
                Ok(())
            }
            "emitmix" => {
                // Small and large records interleaved: order must hold.
                for (i, size) in [4, 70000, 4, 5000, 4].iter().enumerate() {
                    self.padded(i as i64, *size);
                    check(clink::emit(r.key, &self.tmp))?;
                }
                Ok(())
            }
            "mallocs" => clink::emit(r.key, b"{\"mallocs\":-1}"), // Rust's allocator keeps no count
            "order" => {
                clink::set_resume_order(parse(arg));
                Ok(())
            }
            "watermark" => {
                self.obj(&[("watermark", &int(clink::watermark()))]);
                self.emit_out(r)
            }
            "time" => {
                self.obj(&[("time", &int(clink::processing_time()))]);
                self.emit_out(r)
            }
            "log" => {
                clink::logf!(Level::Debug, "debug {}", arg);
                clink::logf!(Level::Info, "info {}", arg);
                clink::logf!(Level::Warn, "warn {}", arg);
                clink::logf!(Level::Error, "error {}", arg);
                Ok(())
            }
            "fail" => Err(format!("failed on purpose: {}", arg).into()),
            "json" => match json::field(arg.as_bytes(), "v") {
                None => clink::emit(r.key, b"{\"field\":null}"),
                Some(raw) => {
                    let i = json::parse_int(raw).map(int).unwrap_or_else(|| b"null".to_vec());
                    self.obj(&[("field", raw), ("int", &i)]);
                    self.emit_out(r)
                }
            },
            "unquote" => match json::field(arg.as_bytes(), "v") {
                None => clink::emit(r.key, b"{\"unquoted\":null}"),
                Some(raw) => {
                    let mut u = Vec::new();
                    if !json::unquote(&mut u, raw) {
                        return clink::emit(r.key, b"{\"unquoted\":false}");
                    }
                    self.obj(&[("unquoted", &string(&u))]);
                    self.emit_out(r)
                }
            },
            "key" => {
                self.obj(&[("key", &string(r.key))]);
                self.emit_out(r)
            }
            "bigemit" => {
                let mut v = vec![b'y'; parse(arg) as usize + 2];
                let last = v.len() - 1;
                v[0] = b'"';
                v[last] = b'"';
                clink::emit(r.key, &v)
            }
            _ => Err(format!("unknown command \"{}\"", cmd).into()),
        }
    }
}

clink::export_operator!("conformance", || Conformance {
    kv: State::new("kv", 0),
    dict: State::new("map", 0),
    big: State::new("big", 0),
    echo: Endpoint::new("echo"),
    // Two prefetched states: the second frame's place depends on the first frame's cap.
    pf: State::new("pf", clink::PREFETCH),
    pf2: State::new("pf2", clink::PREFETCH),
    out: Vec::new(),
    tmp: Vec::new(),
});

static mut KEY: Vec<u8> = Vec::new();

/// Keys records by their "user" field: a string unquoted, anything else as written.
fn key_of_user(value: &[u8]) -> Option<&[u8]> {
    let raw = json::field(value, "user")?;
    if raw[0] != b'"' {
        return Some(raw);
    }
    // SAFETY: single-threaded; the key buffer is read by the host before the next call.
    let k = unsafe { &mut *std::ptr::addr_of_mut!(KEY) };
    k.clear();
    if !json::unquote(k, raw) {
        return None;
    }
    Some(&k[..])
}

clink::export_key_function!(key_of_user);
