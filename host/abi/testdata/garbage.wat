;; garbage: emits a value that is not JSON.
(module
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; clink.manifest: {"abi":1,"name":"garbage"}
  (data (i32.const 0) "{not json\ff\00")
  (func (export "clink_input") (param i32) (result i32) (i32.const 4096))
  (func (export "clink_process") (param i32 i32 i64) (result i32)
    (call $emit (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 11))))
