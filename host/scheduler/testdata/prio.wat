;; prio: sets its resume order from the record value (an i64), reads state (a cold read in the
;; test), and emits the order it ran with.
;; clink.manifest: {"abi":1,"name":"prio","states":["s"]}
(module
  (import "clink_v1" "get_async" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "set_resume_order" (func $order (param i64)))
  (memory (export "memory") 1)
  (func (export "clink_input") (param $cap i32) (result i32)
    (if (i32.gt_u (local.get $cap) (i32.const 32768)) (then (return (i32.const 0))))
    (i32.const 16384))
  (func (export "clink_process") (param $kl i32) (param $vl i32) (param $ts i64) (result i32)
    (call $order (i64.load (i32.add (i32.const 16384) (local.get $kl))))
    (drop (call $get (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 1024) (i32.const 8)))
    (call $emit (i32.const 16384) (local.get $kl) (i32.add (i32.const 16384) (local.get $kl)) (i32.const 8)))
)
