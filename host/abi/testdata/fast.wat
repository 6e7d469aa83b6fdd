;; fast: exercises the fast paths (docs/abi.md, "Fast paths"). States "n" and "m" are
;; prefetched. clink_open registers a 64-byte output area at 8192. The first value byte of a
;; record picks what clink_process does:
;;   'c'  n = (n absent ? 0 : n) + 1 via the frame (8 bytes, DIRTY); emit (key, n) via the area
;;   'd'  delete n via the frame
;;   'b'  mark n's frame DIRTY with len = cap + 1 (a fault)
;;   'o'  emit three 20-byte records through the area; the third needs a flush_output first
;;   'u'  set the area's used past its capacity (a fault)
;;   'w'  write m = "hi" via m's frame
;;   'r'  emit (key, m's frame value) via the area, without writing anything back
;; clink.manifest: {"abi":1,"name":"fast","states":["n","m"],"prefetch":["n","m"]}
(module
  (import "clink_v1" "output_area" (func $area (param i32 i32) (result i32)))
  (import "clink_v1" "flush_output" (func $flush (result i32)))
  (memory (export "memory") 1)
  (global $in i32 (i32.const 16384))
  (func (export "clink_input") (param $cap i32) (result i32)
    (if (i32.gt_u (local.get $cap) (i32.const 32768)) (then (return (i32.const 0))))
    (global.get $in))
  (func (export "clink_open") (result i32)
    (call $area (i32.const 8192) (i32.const 64)))
  ;; frame addresses
  (func $frame0 (param $kl i32) (param $vl i32) (result i32)
    (i32.add (global.get $in)
      (i32.and (i32.add (i32.add (local.get $kl) (local.get $vl)) (i32.const 7)) (i32.const -8))))
  (func $frame1 (param $f0 i32) (result i32)
    (i32.add (i32.add (local.get $f0) (i32.const 16)) (i32.load offset=4 (local.get $f0))))
  ;; append a record (key at kp/kl, value at vp/vl) to the area, flushing first if it won't fit
  (func $emit (param $kp i32) (param $kl i32) (param $vp i32) (param $vl i32)
    (local $used i32) (local $need i32) (local $at i32)
    (local.set $need (i32.add (i32.const 8) (i32.add (local.get $kl) (local.get $vl))))
    (local.set $used (i32.load (i32.const 8192)))
    (if (i32.gt_u (i32.add (i32.add (local.get $used) (local.get $need)) (i32.const 4)) (i32.const 64))
      (then (drop (call $flush)) (local.set $used (i32.const 0))))
    (local.set $at (i32.add (i32.const 8196) (local.get $used)))
    (i32.store (local.get $at) (local.get $kl))
    (i32.store offset=4 (local.get $at) (local.get $vl))
    (memory.copy (i32.add (local.get $at) (i32.const 8)) (local.get $kp) (local.get $kl))
    (memory.copy (i32.add (i32.add (local.get $at) (i32.const 8)) (local.get $kl)) (local.get $vp) (local.get $vl))
    (i32.store (i32.const 8192) (i32.add (local.get $used) (local.get $need))))
  (func (export "clink_process") (param $kl i32) (param $vl i32) (param $ts i64) (result i32)
    (local $op i32) (local $f0 i32) (local $f1 i32)
    (local.set $op (i32.load8_u (i32.add (global.get $in) (local.get $kl))))
    (local.set $f0 (call $frame0 (local.get $kl) (local.get $vl)))
    (local.set $f1 (call $frame1 (local.get $f0)))
    (block $done
      (if (i32.eq (local.get $op) (i32.const 99)) ;; 'c'
        (then
          (if (i32.eq (i32.load (local.get $f0)) (i32.const -1))
            (then (i64.store offset=16 (local.get $f0) (i64.const 0))))
          (i64.store offset=16 (local.get $f0) (i64.add (i64.load offset=16 (local.get $f0)) (i64.const 1)))
          (i32.store (local.get $f0) (i32.const 8))
          (i32.store offset=8 (local.get $f0) (i32.const 1))
          (call $emit (global.get $in) (local.get $kl) (i32.add (local.get $f0) (i32.const 16)) (i32.const 8))
          (br $done)))
      (if (i32.eq (local.get $op) (i32.const 100)) ;; 'd'
        (then (i32.store (local.get $f0) (i32.const -1)) (i32.store offset=8 (local.get $f0) (i32.const 1)) (br $done)))
      (if (i32.eq (local.get $op) (i32.const 98)) ;; 'b'
        (then
          (i32.store (local.get $f0) (i32.add (i32.load offset=4 (local.get $f0)) (i32.const 1)))
          (i32.store offset=8 (local.get $f0) (i32.const 1)) (br $done)))
      (if (i32.eq (local.get $op) (i32.const 111)) ;; 'o': three 20-byte records (key 4 + value 8 + 8)
        (then
          (call $emit (global.get $in) (i32.const 4) (i32.const 0) (i32.const 8))
          (call $emit (global.get $in) (i32.const 4) (i32.const 8) (i32.const 8))
          (call $emit (global.get $in) (i32.const 4) (i32.const 16) (i32.const 8))
          (br $done)))
      (if (i32.eq (local.get $op) (i32.const 117)) ;; 'u'
        (then (i32.store (i32.const 8192) (i32.const 61)) (br $done)))
      (if (i32.eq (local.get $op) (i32.const 119)) ;; 'w'
        (then
          (i32.store16 offset=16 (local.get $f1) (i32.const 0x6968)) ;; "hi"
          (i32.store (local.get $f1) (i32.const 2))
          (i32.store offset=8 (local.get $f1) (i32.const 1)) (br $done)))
      (if (i32.eq (local.get $op) (i32.const 114)) ;; 'r'
        (then
          (if (i32.ne (i32.load (local.get $f1)) (i32.const -1))
            (then (call $emit (global.get $in) (local.get $kl) (i32.add (local.get $f1) (i32.const 16)) (i32.load (local.get $f1)))))
          (br $done))))
    (i32.const 0))
  (data (i32.const 0) "AAAAAAAABBBBBBBBCCCCCCCC")
)
