;; recursion: unbounded recursion, a stack overflow trap.
(module
  (memory (export "memory") 1)
  ;; clink.manifest: {"abi":1,"name":"recursion"}
  (func $down (param $n i32) (result i32) (call $down (i32.add (local.get $n) (i32.const 1))))
  (func (export "clink_input") (param i32) (result i32) (i32.const 4096))
  (func (export "clink_process") (param i32 i32 i64) (result i32)
    (call $down (i32.const 0))))
