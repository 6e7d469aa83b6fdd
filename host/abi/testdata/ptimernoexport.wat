;; ptimernoexport: each record registers a processing-time timer at its timestamp and deletes one at
;; timestamp + 1, and emits the two result codes (two i32s). The module does not export clink_on_processing_timer, so registering is NOT_ALLOWED.
(module
  (import "clink_v1" "processing_timer_register" (func $reg (param i64) (result i32)))
  (import "clink_v1" "processing_timer_delete" (func $del (param i64) (result i32)))
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; clink.manifest: {"abi":1,"name":"ptimernoexport"}
  (func (export "clink_input") (param $cap i32) (result i32)
    (if (i32.gt_u (local.get $cap) (i32.const 4096)) (then (return (i32.const 0))))
    (i32.const 8192))
  (func (export "clink_process") (param $kl i32) (param $vl i32) (param $ts i64) (result i32)
    (i32.store (i32.const 1024) (call $reg (local.get $ts)))
    (i32.store (i32.const 1028) (call $del (i64.add (local.get $ts) (i64.const 1))))
    (drop (call $emit (i32.const 0) (i32.const 0) (i32.const 1024) (i32.const 8)))
    (i32.const 0))

)
