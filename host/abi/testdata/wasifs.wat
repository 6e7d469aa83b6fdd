;; wasifs: probes the sandboxed WASI. It asks for preopened directory fd 3, tries to open a
;; path relative to it, reads random bytes and the clock, and emits the results as 4 i32 values:
;; [errno of fd_prestat_get(3), errno of path_open(3, "etc/passwd"), errno of random_get,
;;  errno of clock_time_get].
;; clink.manifest: {"abi":1,"name":"wasifs"}
(module
  (import "wasi_snapshot_preview1" "fd_prestat_get" (func $prestat (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open" (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $rand (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 200) "etc/passwd")
  (func (export "clink_input") (param i32) (result i32) (i32.const 4096))
  (func (export "clink_process") (param i32 i32 i64) (result i32)
    (i32.store (i32.const 0) (call $prestat (i32.const 3) (i32.const 100)))
    (i32.store (i32.const 4) (call $open (i32.const 3) (i32.const 0) (i32.const 200) (i32.const 10)
                                         (i32.const 0) (i64.const 0) (i64.const 0) (i32.const 0) (i32.const 300)))
    (i32.store (i32.const 8) (call $rand (i32.const 400) (i32.const 16)))
    (i32.store (i32.const 12) (call $clock (i32.const 0) (i64.const 1) (i32.const 500)))
    (call $emit (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 16)))
)
