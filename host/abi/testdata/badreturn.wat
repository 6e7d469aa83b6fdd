;; badreturn: logs an error and returns status 7.
(module
  (import "clink_v1" "log" (func $log (param i32 i32 i32)))
  (memory (export "memory") 1)
  ;; clink.manifest: {"abi":1,"name":"badreturn"}
  (data (i32.const 0) "cannot parse record")
  (func (export "clink_input") (param i32) (result i32) (i32.const 4096))
  (func (export "clink_process") (param i32 i32 i64) (result i32)
    (call $log (i32.const 3) (i32.const 0) (i32.const 19))
    (i32.const 7)))
