//! aggregate keeps a running count, sum, min and max of the integer field "value" per key and
//! emits {"key":K,"count":N,"sum":S,"min":MIN,"max":MAX} for every record it aggregates.
//!
//! A record whose "value" is missing or not a JSON integer within int64 is skipped with a
//! warning in the operator log. A sum that would overflow int64 fails the record.
use clink::{i64_decode, json, Level, Operator, Record, State};

struct Aggregate {
    // Per record key: count, sum, min and max as four little-endian int64s. Prefetched:
    // delivered with each record and written back by the host, with no import call.
    aggs: State,
    got: Vec<u8>,
    out: Vec<u8>,
}

impl Operator for Aggregate {
    fn process(&mut self, r: &Record) -> clink::Result<()> {
        let v = match json::field_int(r.value, "value") {
            Some(v) => v,
            None => {
                clink::log(Level::Warn, "skipping a record whose \"value\" is not an integer");
                return Ok(());
            }
        };
        self.got.clear();
        let (count, sum, lo, hi) = if !self.aggs.get_into(b"", &mut self.got)? {
            (1, v, v, v)
        } else if self.got.len() != 32 {
            return Err("aggregate: corrupt state (want 32 bytes)".into());
        } else {
            let g = &self.got;
            let sum = i64_decode(&g[8..]).checked_add(v).ok_or("aggregate: sum overflows int64")?;
            (i64_decode(g) + 1, sum, i64_decode(&g[16..]).min(v), i64_decode(&g[24..]).max(v))
        };
        let mut buf = [0u8; 32];
        for (i, x) in [count, sum, lo, hi].iter().enumerate() {
            buf[8 * i..8 * i + 8].copy_from_slice(&x.to_le_bytes());
        }
        self.aggs.put(b"", &buf)?;

        let o = &mut self.out;
        o.clear();
        o.extend_from_slice(b"{\"key\":");
        json::append_string(o, r.key);
        for (name, x) in [(&b",\"count\":"[..], count), (b",\"sum\":", sum), (b",\"min\":", lo), (b",\"max\":", hi)] {
            o.extend_from_slice(name);
            json::append_int(o, x);
        }
        o.push(b'}');
        clink::emit(r.key, o)
    }
}

clink::export_operator!("aggregate", || Aggregate {
    aggs: State::new("agg", clink::PREFETCH),
    got: Vec::with_capacity(32),
    out: Vec::new(),
});
