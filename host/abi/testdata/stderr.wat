;; stderr: writes a Go-style panic line to stderr through WASI, then traps.
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; clink.manifest: {"abi":1,"name":"panicker"}
  (data (i32.const 100) "panic: index out of range [3] with length 2\ngoroutine 1 [running]:\n")
  (func (export "clink_input") (param i32) (result i32) (i32.const 4096))
  (func (export "clink_process") (param i32 i32 i64) (result i32)
    (i32.store (i32.const 0) (i32.const 100))
    (i32.store (i32.const 4) (i32.const 67))
    (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))
    unreachable))
