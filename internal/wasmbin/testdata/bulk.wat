;; Bulk memory and table instructions (0xfc 8-17), passive data, the data
;; count section, and non-trapping float-to-int conversions (0xfc 0-7).
(module
  (memory (export "memory") 1)
  (data $greeting "hello, world")
  (data (i32.const 64) "\ff\ff")
  (table $t 2 funcref)
  (table $u 0 externref)
  (elem $e func $seven $eight)

  (func $seven (result i32) (i32.const 7))
  (func $eight (result i32) (i32.const 8))

  ;; mem_ops copies the passive segment, duplicates it, fills a gap and drops
  ;; the segment, then returns a checksum of memory[0..32).
  (func (export "mem_ops") (result i32)
    (local $i i32) (local $sum i32)
    (memory.init $greeting (i32.const 0) (i32.const 0) (i32.const 12))
    (data.drop $greeting)
    (memory.copy (i32.const 16) (i32.const 0) (i32.const 12))
    (memory.fill (i32.const 12) (i32.const 0x2a) (i32.const 4))
    (loop $l
      (local.set $sum (i32.add (i32.mul (local.get $sum) (i32.const 31))
        (i32.load8_u (local.get $i))))
      (br_if $l (i32.lt_u (local.tee $i (i32.add (local.get $i) (i32.const 1))) (i32.const 32))))
    (local.get $sum))

  ;; tables grows, fills, copies and initialises tables and returns a checksum.
  (func (export "tables") (result i32)
    (table.init $t $e (i32.const 0) (i32.const 0) (i32.const 2))
    (elem.drop $e)
    (drop (table.grow $t (ref.null func) (i32.const 2)))
    (table.copy $t $t (i32.const 2) (i32.const 0) (i32.const 2))
    (table.fill $t (i32.const 3) (ref.func $seven) (i32.const 1))
    (drop (table.grow $u (ref.null extern) (i32.const 3)))
    (i32.add
      (i32.mul (table.size $t) (i32.const 100))
      (i32.add (i32.mul (table.size $u) (i32.const 1000))
        (i32.add (call_indirect $t (result i32) (i32.const 2))
                 (call_indirect $t (result i32) (i32.const 3))))))

  (func (export "trunc_sat") (param f64) (result i32)
    (i32.add (i32.trunc_sat_f64_s (local.get 0))
      (i32.wrap_i64 (i64.trunc_sat_f32_u (f32.demote_f64 (local.get 0)))))))
