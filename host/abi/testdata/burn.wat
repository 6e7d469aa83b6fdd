;; burn: a heavy but well-behaved operator: each record costs 300000 iterations of a dependent
;; multiply-add (a few hundred microseconds of CPU) and emits nothing. The noisy neighbour of
;; host/server's BenchmarkNoisyNeighbour.
(module
  (memory (export "memory") 1)
  ;; clink.manifest: {"abi":1,"name":"burn"}
  (func (export "clink_input") (param i32) (result i32) (i32.const 4096))
  (func (export "clink_process") (param i32 i32 i64) (result i32)
    (local $i i32) (local $x i64)
    (loop $l
      (local.set $x (i64.add (i64.mul (local.get $x) (i64.const 6364136223846793005)) (i64.const 1442695040888963407)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 300000))))
    (i64.store (i32.const 0) (local.get $x))
    (i32.const 0)))
