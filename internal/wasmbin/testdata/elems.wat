;; Element segments in all eight encodings (flags 0-7), ref.func in code, in
;; global initialisers and in element expressions, several tables, table.init
;; and elem.drop. Every function reference must be renumbered.
(module
  (type $ret (func (result i32)))
  (import "env" "ten" (func $ten (result i32)))

  (table $t0 8 funcref)
  (table $t1 8 funcref)

  (func $one (type $ret) (i32.const 1))
  (func $two (type $ret) (i32.const 2))
  (func $three (type $ret) (i32.const 3))
  (func $four (type $ret) (i32.const 4))
  (func $five (type $ret) (i32.const 5))
  (func $six (type $ret) (i32.const 6))

  (global $gref funcref (ref.func $five))

  ;; flags 0: active, table 0, function indices
  (elem (i32.const 0) $one $two $ten)
  ;; flags 1: passive, function indices
  (elem $p1 func $three $four)
  ;; flags 2: active, explicit table, function indices
  (elem (table $t1) (i32.const 0) func $four $three $ten)
  ;; flags 3: declarative, function indices
  (elem declare func $six)
  ;; flags 4: active, table 0, expressions
  (elem (i32.const 4) funcref (ref.func $five) (ref.null func) (ref.func $ten))
  ;; flags 5: passive, expressions
  (elem $p5 funcref (ref.func $six) (ref.null func) (ref.func $one))
  ;; flags 6: active, explicit table, expressions
  (elem (table $t1) (i32.const 4) funcref (ref.func $two) (ref.func $six) (ref.null func))
  ;; flags 7: declarative, expressions
  (elem declare funcref (ref.func $one) (ref.null func) (ref.func $two))

  (func (export "call0") (param i32) (result i32)
    (call_indirect $t0 (type $ret) (local.get 0)))
  (func (export "call1") (param i32) (result i32)
    (call_indirect $t1 (type $ret) (local.get 0)))

  ;; Copy the passive segments into the tables, then drop them.
  (func (export "init")
    (table.init $t0 $p1 (i32.const 6) (i32.const 0) (i32.const 2))
    (table.init $t1 $p5 (i32.const 6) (i32.const 0) (i32.const 2))
    (elem.drop $p1)
    (elem.drop $p5))

  ;; ref.func in code and in a global: store both, then call through the table.
  (func (export "refs") (result i32)
    (table.set $t0 (i32.const 2) (ref.func $six))
    (table.set $t0 (i32.const 3) (global.get $gref))
    (i32.add
      (call_indirect $t0 (type $ret) (i32.const 2))
      (i32.mul (i32.const 10) (call_indirect $t0 (type $ret) (i32.const 3)))))

  (func (export "is_null") (param i32) (result i32)
    (ref.is_null (table.get $t0 (local.get 0)))))
