;; Tail calls: return_call (0x12) and return_call_indirect (0x13). Deep mutual
;; recursion only works if tail calls stay tail calls after the rewrite.
(module
  (type $pred (func (param i64) (result i32)))
  (table 2 funcref)
  (elem (i32.const 0) $is_even $is_odd)

  (func $is_even (export "is_even") (type $pred)
    (if (result i32) (i64.eqz (local.get 0))
      (then (i32.const 1))
      (else (return_call $is_odd (i64.sub (local.get 0) (i64.const 1))))))

  (func $is_odd (export "is_odd") (type $pred)
    (if (result i32) (i64.eqz (local.get 0))
      (then (i32.const 0))
      (else (return_call_indirect (type $pred) (i64.sub (local.get 0) (i64.const 1)) (i32.const 0))))))
