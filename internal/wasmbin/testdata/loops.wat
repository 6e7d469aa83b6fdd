;; Loops: counted, with parameters and results (multi-value), nested, reached
;; through br_table, inside if/else, and one that never ends.
(module
  ;; count runs a loop of exactly $n iterations (n >= 1) and returns n.
  (func $count (export "count") (param $n i32) (result i32)
    (local $i i32)
    (loop $l
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $i))

  ;; sum_params sums 1..n with the running sum and counter as loop parameters
  ;; and the sum as the loop result.
  (func (export "sum_params") (param $n i32) (result i64)
    (i64.const 0) (local.get $n)
    (loop $l (param i64 i32) (result i64)
      (local.set $n)                                  ;; counter
      (i64.add (i64.extend_i32_u (local.get $n)))     ;; sum += counter
      (local.tee $n (i32.sub (local.get $n) (i32.const 1)))
      (br_if $l (local.get $n))                       ;; continue with (sum, n-1)
      (drop)))

  ;; swap_loop swaps a pair n times inside a loop typed (i32 i32) -> (i32 i32).
  (func (export "swap_loop") (param $a i32) (param $b i32) (param $n i32) (result i32 i32)
    (local.get $a) (local.get $b)
    (loop $l (param i32 i32) (result i32 i32)
      (local.set $a) (local.set $b)
      (local.get $a) (local.get $b)
      (br_if $l (i32.gt_s (local.tee $n (i32.sub (local.get $n) (i32.const 1))) (i32.const 0)))))

  ;; nested counts the iterations of an n x m loop nest, with a third level
  ;; that runs once per inner iteration.
  (func (export "nested") (param $n i32) (param $m i32) (result i32)
    (local $i i32) (local $j i32) (local $c i32)
    (loop $outer
      (local.set $j (i32.const 0))
      (loop $inner
        (loop $once (local.set $c (i32.add (local.get $c) (i32.const 1))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br_if $inner (i32.lt_u (local.get $j) (local.get $m))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $outer (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $c))

  ;; state_machine cycles states 0 -> 1 -> 2 -> 0 via br_table until $n steps
  ;; are done, and returns a checksum of the visited states.
  (func (export "state_machine") (param $n i32) (result i32)
    (local $state i32) (local $sum i32)
    (loop $dispatch
      (if (i32.eqz (local.get $n)) (then (return (local.get $sum))))
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (local.set $sum (i32.add (i32.mul (local.get $sum) (i32.const 3)) (local.get $state)))
      (block $s2
        (block $s1
          (block $s0
            (br_table $s0 $s1 $s2 (local.get $state)))
          (local.set $state (i32.const 1))
          (br $dispatch))
        (local.set $state (i32.const 2))
        (br $dispatch))
      (local.set $state (i32.const 0))
      (br $dispatch))
    (unreachable))

  ;; branchy has loops in both arms of an if.
  (func (export "branchy") (param $n i32) (result i32)
    (local $acc i32)
    (if (i32.and (local.get $n) (i32.const 1))
      (then (loop $odd
        (local.set $acc (i32.add (local.get $acc) (i32.const 3)))
        (br_if $odd (i32.gt_s (local.tee $n (i32.sub (local.get $n) (i32.const 1))) (i32.const 0)))))
      (else (loop $even
        (local.set $acc (i32.add (local.get $acc) (i32.const 5)))
        (br_if $even (i32.gt_s (local.tee $n (i32.sub (local.get $n) (i32.const 1))) (i32.const 0))))))
    (local.get $acc))

  ;; recurse calls itself $n times: only function-entry checks count here.
  (func $recurse (export "recurse") (param $n i32) (result i32)
    (if (result i32) (i32.eqz (local.get $n))
      (then (i32.const 0))
      (else (i32.add (i32.const 1) (call $recurse (i32.sub (local.get $n) (i32.const 1)))))))

  ;; spin never returns.
  (func (export "spin")
    (loop $forever (br $forever))))
