;; SIMD: memory operands, lanes, 16-byte immediates, and opcodes >= 0x80 whose
;; LEB128 encoding is two bytes.
(module
  (memory (export "memory") 1)
  (data (i32.const 0) "\01\00\02\00\03\00\04\00\05\00\06\00\07\00\08\00")

  ;; dot sums i16x8 lanes of memory[0..16) times a constant vector using
  ;; i32x4.dot_i16x8_s (0xba), extadd, shuffle and lane extraction.
  (func (export "dot") (result i32)
    (local $v v128)
    (local.set $v
      (i32x4.dot_i16x8_s
        (v128.load (i32.const 0))
        (v128.const i16x8 1 1 1 1 1 1 1 1)))
    (local.set $v (i32x4.add (local.get $v)
      (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $v) (local.get $v))))
    (i32.add (i32x4.extract_lane 0 (local.get $v)) (i32x4.extract_lane 1 (local.get $v))))

  ;; lanes exercises load/store lane, replace lane, abs (0x80 01), splat and
  ;; load zero, and loops over memory with a vector accumulator.
  (func (export "lanes") (param $n i32) (result i64)
    (local $acc v128) (local $i i32)
    (local.set $acc (v128.load32_zero (i32.const 4)))
    (loop $l
      (local.set $acc (i16x8.add (local.get $acc)
        (i16x8.abs (v128.load16_lane 3 (i32.const 2) (i16x8.splat (i32.const -2))))))
      (local.set $acc (i32x4.replace_lane 3 (local.get $acc) (i32.const 9)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (v128.store64_lane 1 (i32.const 32) (local.get $acc))
    (i64.add (i64.load (i32.const 32)) (i64x2.extract_lane 0 (local.get $acc))))

  ;; minmax uses f32x4 pmin/pmax (0xea/0xeb) and i64x2.all_true (0xc3 01).
  (func (export "minmax") (param f32 f32) (result f32)
    (local $a v128)
    (local.set $a (f32x4.pmax (f32x4.splat (local.get 0)) (f32x4.splat (local.get 1))))
    (f32.add (f32x4.extract_lane 2 (local.get $a))
      (f32.convert_i32_u (i64x2.all_true (i64x2.splat (i64.const 1)))))))
