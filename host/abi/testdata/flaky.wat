;; flaky: a keyed counter that asks its upstream first. Each record is POSTed to endpoint
;; "svc" at /check; a response starting with 't' makes the call trap right there, before it
;; has read or written any state or emitted anything (a fault without effect, which the host
;; may retry or dead-letter). Otherwise it counts the record in state "count" (8-byte
;; little-endian) and emits, with the record key, the response followed by N and "}": an
;; upstream that answers {"i":7,"count": makes it emit {"i":7,"count":N}. Tests make the
;; upstream answer 't' on chosen attempts (by the request's Idempotency-Key, stable across
;; retries).
;; clink.manifest: {"abi":1,"name":"flaky","states":["count"],"endpoints":["svc"]}
(module
  (import "clink_v1" "lookup" (func $lookup (param i32 i32 i32 i32 i32) (result i64)))
  (import "clink_v1" "get_async" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "put" (func $put (param i32 i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "log" (func $log (param i32 i32 i32)))
  (memory (export "memory") 4)
  (data (i32.const 0) "POST /check\n\n")
  (data (i32.const 64) "told to trap")
  ;; request buffer at 1024 (the 13-byte head, then the value), response at 131072 (64 KiB),
  ;; the count cell at 2048, input buffer at 65536; the output is built after the response.
  (func (export "clink_input") (param $cap i32) (result i32)
    (if (i32.gt_u (local.get $cap) (i32.const 65536)) (then (return (i32.const 0))))
    (i32.const 65536))
  (func $itoa (param $v i64) (param $p i32) (result i32)
    (local $q i32) (local $n i32) (local $t i64)
    (local.set $t (local.get $v)) (local.set $n (i32.const 1))
    (block $d (loop $l
      (local.set $t (i64.div_u (local.get $t) (i64.const 10)))
      (br_if $d (i64.eqz (local.get $t)))
      (local.set $n (i32.add (local.get $n) (i32.const 1)))
      (br $l)))
    (local.set $q (i32.add (local.get $p) (local.get $n)))
    (local.set $p (local.get $q))
    (loop $w
      (local.set $p (i32.sub (local.get $p) (i32.const 1)))
      (i32.store8 (local.get $p) (i32.add (i32.const 48) (i32.wrap_i64 (i64.rem_u (local.get $v) (i64.const 10)))))
      (local.set $v (i64.div_u (local.get $v) (i64.const 10)))
      (br_if $w (i64.ne (local.get $v) (i64.const 0))))
    (local.get $q))
  (func (export "clink_process") (param $kl i32) (param $vl i32) (param $ts i64) (result i32)
    (local $r i64) (local $n i32) (local $end i32)
    (if (i32.gt_u (local.get $vl) (i32.const 60000)) (then (return (i32.const 1))))
    (memory.copy (i32.const 1024) (i32.const 0) (i32.const 13))
    (memory.copy (i32.const 1037) (i32.add (i32.const 65536) (local.get $kl)) (local.get $vl))
    (local.set $r (call $lookup (i32.const 0) (i32.const 1024) (i32.add (i32.const 13) (local.get $vl))
                                (i32.const 131072) (i32.const 65536)))
    ;; a lookup error fails the call with code 2
    (if (i64.lt_s (local.get $r) (i64.const 0)) (then (return (i32.const 2))))
    ;; packed (status, n): the body's length is the low half
    (local.set $n (i32.wrap_i64 (local.get $r)))
    (if (i32.gt_u (local.get $n) (i32.const 65000)) (then (return (i32.const 3))))
    (if (i32.and (i32.gt_u (local.get $n) (i32.const 0)) (i32.eq (i32.load8_u (i32.const 131072)) (i32.const 116)))
      (then
        (call $log (i32.const 3) (i32.const 64) (i32.const 12))
        unreachable))
    (if (i32.lt_s (call $get (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 2048) (i32.const 8)) (i32.const 0))
      (then (i64.store (i32.const 2048) (i64.const 0))))
    (i64.store (i32.const 2048) (i64.add (i64.load (i32.const 2048)) (i64.const 1)))
    (drop (call $put (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 2048) (i32.const 8)))
    (local.set $end (call $itoa (i64.load (i32.const 2048)) (i32.add (i32.const 131072) (local.get $n))))
    (i32.store8 (local.get $end) (i32.const 125))
    (call $emit (i32.const 65536) (local.get $kl) (i32.const 131072) (i32.sub (i32.add (local.get $end) (i32.const 1)) (i32.const 131072))))
)
