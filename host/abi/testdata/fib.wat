;; fib: exponential recursion with no loops: only function-entry fuel can stop it.
(module
  (memory (export "memory") 1)
  ;; clink.manifest: {"abi":1,"name":"fib"}
  (func $fib (param $n i64) (result i64)
    (if (result i64) (i64.lt_u (local.get $n) (i64.const 2))
      (then (local.get $n))
      (else (i64.add (call $fib (i64.sub (local.get $n) (i64.const 1)))
                     (call $fib (i64.sub (local.get $n) (i64.const 2)))))))
  (func (export "clink_input") (param i32) (result i32) (i32.const 4096))
  (func (export "clink_process") (param i32 i32 i64) (result i32)
    (drop (call $fib (i64.const 90)))
    (i32.const 0)))
