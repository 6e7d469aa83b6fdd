;; opensetup: clink_open logs "open", reads the watermark and sends a lookup (endpoint 0,
;; request "open"), keeping the lookup's status and the watermark, and fails (returns 1) unless
;; the status is 200; clink_process reads state 0
;; with get_async (a cold read suspends the call, so a cold workload holds many instances) and
;; emits (key, open's status i32 ++ open's watermark i64 ++ the get's result i32).
;; clink.manifest: {"abi":1,"name":"opensetup","states":["s"],"endpoints":["svc"]}
(module
  (import "clink_v1" "lookup" (func $lookup (param i32 i32 i32 i32 i32) (result i64)))
  (import "clink_v1" "get_async" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "log" (func $log (param i32 i32 i32)))
  (import "clink_v1" "watermark" (func $wm (result i64)))
  (memory (export "memory") 1)
  (data (i32.const 0) "open")
  (func (export "clink_input") (param $cap i32) (result i32)
    (if (i32.gt_u (local.get $cap) (i32.const 16384)) (then (return (i32.const 0))))
    (i32.const 32768))
  (func (export "clink_open") (result i32)
    (local $r i64)
    (call $log (i32.const 1) (i32.const 0) (i32.const 4))
    (i64.store (i32.const 1028) (call $wm))
    (local.set $r (call $lookup (i32.const 0) (i32.const 0) (i32.const 4) (i32.const 2048) (i32.const 1024)))
    (i32.store (i32.const 1024) (i32.wrap_i64 (i64.shr_u (local.get $r) (i64.const 32))))
    (i32.ne (i32.load (i32.const 1024)) (i32.const 200)))
  (func (export "clink_process") (param $kl i32) (param $vl i32) (param $ts i64) (result i32)
    (i32.store (i32.const 1036)
      (call $get (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0)))
    (call $emit (i32.const 32768) (local.get $kl) (i32.const 1024) (i32.const 16)))
)
