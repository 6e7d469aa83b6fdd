;; enrichtrap: enrich (see enrich.wat) without keyed state, except that a record whose value
;; starts with "!" traps (unreachable) before it sends anything: one faulty record among many
;; whose lookups are in flight.
;; clink.manifest: {"abi":1,"name":"enrichtrap","endpoints":["svc"]}
(module
  (import "clink_v1" "lookup" (func $lookup (param i32 i32 i32 i32 i32) (result i64)))
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "clink_input") (param $cap i32) (result i32)
    (if (i32.gt_u (local.get $cap) (i32.const 16384)) (then (return (i32.const 0))))
    (i32.const 32768))
  (func (export "clink_process") (param $kl i32) (param $vl i32) (param $ts i64) (result i32)
    (local $r i64)
    (if (i32.eq (i32.load8_u (i32.add (i32.const 32768) (local.get $kl))) (i32.const 33))
      (then unreachable))
    (local.set $r (call $lookup (i32.const 0) (i32.add (i32.const 32768) (local.get $kl)) (local.get $vl)
                                (i32.const 1024) (i32.const 8192)))
    (if (i64.lt_s (local.get $r) (i64.const 0)) (then (return (i32.const 9))))
    (call $emit (i32.const 32768) (local.get $kl) (i32.const 1024) (i32.wrap_i64 (local.get $r))))
)
