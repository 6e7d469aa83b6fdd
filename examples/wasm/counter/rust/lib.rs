//! counter counts records per key and emits {"key":K,"count":N} per record. Build: see
//! ../../README.md (scripts/build-wasm.sh builds it with rustc directly; guest-sdk/rust/README.md
//! has the cargo recipe).
use clink::{json, Operator, Record, State};

struct Counter {
    // Prefetched: the host delivers each key's count with the record and takes it back
    // written, so the read-modify-write below makes no import call.
    counts: State,
    out: Vec<u8>, // reused for every record
}

impl Operator for Counter {
    fn process(&mut self, r: &Record) -> clink::Result<()> {
        let n = self.counts.get_i64(b"")?.unwrap_or(0) + 1; // empty entry: one value per key
        self.counts.put_i64(b"", n)?;
        self.out.clear();
        self.out.extend_from_slice(b"{\"key\":");
        json::append_string(&mut self.out, r.key);
        self.out.extend_from_slice(b",\"count\":");
        json::append_int(&mut self.out, n);
        self.out.push(b'}');
        clink::emit(r.key, &self.out)
    }
}

clink::export_operator!("counter", || Counter { counts: State::new("count", clink::PREFETCH), out: Vec::new() });
