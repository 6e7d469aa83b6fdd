;; exit: calls WASI proc_exit(3) from clink_process.
(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  ;; clink.manifest: {"abi":1,"name":"exiter"}
  (func (export "clink_input") (param i32) (result i32) (i32.const 4096))
  (func (export "clink_process") (param i32 i32 i64) (result i32)
    (call $exit (i32.const 3))
    (i32.const 0)))
