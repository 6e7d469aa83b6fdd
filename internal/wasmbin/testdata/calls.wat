;; Imports of every kind before the fuel import, defined functions calling each
;; other directly and through a table, a start function, exports of every
;; kind, and (built with --debug-names) a name section with function and local
;; names.
(module
  (type $binop (func (param i32 i32) (result i32)))
  (import "env" "double" (func $double (param i32) (result i32)))
  (import "env" "base" (global $base i32))
  (import "env" "memory" (memory 1))
  (import "env" "triple" (func $triple (param i32) (result i32)))
  (import "env" "counter" (global $counter (mut i32)))

  (global $started (mut i32) (i32.const 0))
  (global $seed i32 (global.get $base))

  (table $ops 4 funcref)
  (elem (i32.const 0) $add $sub $mul $double_add)

  (func $add (type $binop) (i32.add (local.get 0) (local.get 1)))
  (func $sub (type $binop) (i32.sub (local.get 0) (local.get 1)))
  (func $mul (type $binop) (i32.mul (local.get 0) (local.get 1)))
  (func $double_add (type $binop)
    (call $double (call $add (local.get 0) (local.get 1))))

  ;; apply calls table entry $op on $a and $b.
  (func $apply (export "apply") (param $op i32) (param $a i32) (param $b i32) (result i32)
    (call_indirect (type $binop) (local.get $a) (local.get $b) (local.get $op)))

  ;; chain calls imported and defined functions in a row.
  (func $chain (export "chain") (param $x i32) (result i32)
    (local $tmp i32)
    (local.set $tmp (call $triple (local.get $x)))
    (call $add (call $double (local.get $tmp)) (global.get $seed)))

  (func $started (export "started") (result i32) (global.get $started))

  (func $bump (export "bump") (result i32)
    (global.set $counter (i32.add (global.get $counter) (i32.const 1)))
    (global.get $counter))

  (func $init
    (global.set $started (i32.const 42))
    (i32.store (i32.const 0) (i32.const 7)))
  (start $init)

  (export "ops" (table $ops))
  (export "seed" (global $seed))
  (export "mem" (memory 0))
  (export "add_alias" (func $add)))
