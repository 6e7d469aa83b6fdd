;; enrichpf: enrich with its state "s" declared as prefetched (so at the in-flight cap its records wait for room and fetch). enrich: passes the record value through as a lookup request on endpoint 0, then emits
;; (key, body ++ i32 result of a get_async on state 0 ++ i32 status). The get_async result shows
;; whether keyed state is allowed in the pipeline's order mode.
;; clink.manifest: {"abi":1,"name":"enrichpf","states":["s"],"prefetch":["s"],"endpoints":["svc"]}
(module
  (import "clink_v1" "lookup" (func $lookup (param i32 i32 i32 i32 i32) (result i64)))
  (import "clink_v1" "get_async" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "clink_input") (param $cap i32) (result i32)
    (if (i32.gt_u (local.get $cap) (i32.const 16384)) (then (return (i32.const 0))))
    (i32.const 32768))
  (func (export "clink_process") (param $kl i32) (param $vl i32) (param $ts i64) (result i32)
    (local $r i64) (local $n i32)
    (local.set $r (call $lookup (i32.const 0) (i32.add (i32.const 32768) (local.get $kl)) (local.get $vl)
                                (i32.const 1024) (i32.const 8192)))
    (if (i64.lt_s (local.get $r) (i64.const 0)) (then (return (i32.const 9))))
    (local.set $n (i32.wrap_i64 (local.get $r)))
    (i32.store (i32.add (i32.const 1024) (local.get $n))
      (call $get (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0)))
    (i32.store (i32.add (i32.const 1028) (local.get $n)) (i32.wrap_i64 (i64.shr_u (local.get $r) (i64.const 32))))
    (call $emit (i32.const 32768) (local.get $kl) (i32.const 1024) (i32.add (local.get $n) (i32.const 8))))
)
