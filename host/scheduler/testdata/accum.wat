;; accum: the scheduler's property-test operator.
;;   clink_process: value = 8-byte per-key index i. Reads state "n" (the number of records of
;;   this key seen so far, 0 if absent; a cold read suspends), emits (key, [i, n]), writes n+1,
;;   and registers an event-time timer at the record's timestamp. A correct controller makes
;;   n == i for every record: per-key order and read-your-writes.
;;   clink_on_timer: reads "n" too (so timers suspend like records) and emits (key, [-1, ts, n]).
;; clink.manifest: {"abi":1,"name":"accum","states":["n"]}
(module
  (import "clink_v1" "get_async" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "put" (func $put (param i32 i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "timer_register" (func $treg (param i64) (result i32)))
  (memory (export "memory") 1)
  (func (export "clink_input") (param $cap i32) (result i32)
    (if (i32.gt_u (local.get $cap) (i32.const 32768)) (then (return (i32.const 0))))
    (i32.const 16384))
  (func $count (result i64)
    (if (i32.lt_s (call $get (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 1024) (i32.const 8)) (i32.const 0))
      (then (i64.store (i32.const 1024) (i64.const 0))))
    (i64.load (i32.const 1024)))
  (func (export "clink_process") (param $kl i32) (param $vl i32) (param $ts i64) (result i32)
    (local $n i64)
    (local.set $n (call $count))
    (i64.store (i32.const 2048) (i64.load (i32.add (i32.const 16384) (local.get $kl))))
    (i64.store (i32.const 2056) (local.get $n))
    (if (call $emit (i32.const 16384) (local.get $kl) (i32.const 2048) (i32.const 16)) (then unreachable))
    (i64.store (i32.const 1024) (i64.add (local.get $n) (i64.const 1)))
    (drop (call $put (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 1024) (i32.const 8)))
    (drop (call $treg (local.get $ts)))
    (i32.const 0))
  (func (export "clink_on_timer") (param $kl i32) (param $ts i64) (result i32)
    (local $n i64)
    (local.set $n (call $count))
    (i64.store (i32.const 2048) (i64.const -1))
    (i64.store (i32.const 2056) (local.get $ts))
    (i64.store (i32.const 2064) (local.get $n))
    (if (call $emit (i32.const 16384) (local.get $kl) (i32.const 2048) (i32.const 24)) (then unreachable))
    (i32.const 0))
)
