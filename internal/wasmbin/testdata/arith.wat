;; Functions without imports or globals: direct recursion, a loop, early return.
(module
  (func $add (export "add") (param i32 i32) (result i32)
    (i32.add (local.get 0) (local.get 1)))

  ;; Recursive factorial: fuel is taken at every function entry.
  (func $fact (export "fact") (param i64) (result i64)
    (if (result i64) (i64.le_u (local.get 0) (i64.const 1))
      (then (i64.const 1))
      (else (i64.mul (local.get 0) (call $fact (i64.sub (local.get 0) (i64.const 1)))))))

  ;; Iterative Fibonacci with a loop and an early return.
  (func $fib (export "fib") (param $n i32) (result i64)
    (local $a i64) (local $b i64) (local $t i64)
    (if (i32.eqz (local.get $n)) (then (return (i64.const 0))))
    (local.set $b (i64.const 1))
    (loop $next
      (local.set $t (i64.add (local.get $a) (local.get $b)))
      (local.set $a (local.get $b))
      (local.set $b (local.get $t))
      (br_if $next (i32.gt_u (local.tee $n (i32.sub (local.get $n) (i32.const 1)))
                             (i32.const 1))))
    (local.get $b)))
