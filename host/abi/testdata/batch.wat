;; batch: exercises clink_process_batch (docs/abi.md, "Batch calls"). Each record emits
;; (its key, "r<i>") through the 1 KiB output area and writes its out_end, unless the first
;; byte of ITS value picks a misbehaviour:
;;   'e' emit (key, "e<i>") through the emit import, not the area
;;   'f' fill: emit records through the area until it is full, flush, emit "r<i>" (a flush
;;       in the middle of the batch)
;;   'r' return 5 (and write it to the descriptor's rc)
;;   't' trap
;;   'p' write as out_end the area's used before its own record (which is then left over)
;;   'b' move current back to 0, then call the emit import
;;   'x' set current past the batch, then call the emit import
;;   'o' write an out_end past the area's used
;;   'l' leave a record in the area past its out_end (write out_end 0 after emitting)
;;   'g' write rc 3 into its descriptor but go on
;; clink.manifest: {"abi":1,"name":"batcher"}
(module
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "output_area" (func $area (param i32 i32) (result i32)))
  (import "clink_v1" "flush_output" (func $flush (result i32)))
  (memory (export "memory") 2)
  (global $in i32 (i32.const 65536))
  (global $out i32 (i32.const 4096))
  (func (export "clink_input") (param $cap i32) (result i32)
    (if (i32.gt_u (local.get $cap) (i32.const 65536)) (then (return (i32.const 0))))
    (global.get $in))
  (func (export "clink_open") (result i32) (call $area (global.get $out) (i32.const 1024)))
  ;; appends (key, tag, digit) to the area; 0 if it did not fit
  (func $put (param $kp i32) (param $kl i32) (param $tag i32) (param $i i32) (result i32)
    (local $used i32) (local $at i32)
    (local.set $used (i32.load (global.get $out)))
    (if (i32.gt_u (i32.add (i32.add (local.get $used) (i32.add (local.get $kl) (i32.const 10))) (i32.const 4)) (i32.const 1024))
      (then (return (i32.const 0))))
    (local.set $at (i32.add (i32.add (global.get $out) (i32.const 4)) (local.get $used)))
    (i32.store (local.get $at) (local.get $kl))
    (i32.store offset=4 (local.get $at) (i32.const 2))
    (memory.copy (i32.add (local.get $at) (i32.const 8)) (local.get $kp) (local.get $kl))
    (i32.store8 (i32.add (i32.add (local.get $at) (i32.const 8)) (local.get $kl)) (local.get $tag))
    (i32.store8 (i32.add (i32.add (local.get $at) (i32.const 9)) (local.get $kl)) (i32.add (i32.const 0x30) (local.get $i)))
    (i32.store (global.get $out) (i32.add (local.get $used) (i32.add (local.get $kl) (i32.const 10))))
    (i32.const 1))
  (func (export "clink_process") (param $kl i32) (param $vl i32) (param $ts i64) (result i32)
    (drop (call $put (global.get $in) (local.get $kl) (i32.const 0x72) (i32.const 0)))
    (i32.const 0))
  (func (export "clink_process_batch") (param $count i32) (result i32)
    (local $i i32) (local $d i32) (local $at i32) (local $kl i32) (local $op i32)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $count)))
        (i32.store offset=4 (global.get $in) (local.get $i))
        (local.set $d (i32.add (i32.add (global.get $in) (i32.const 16)) (i32.mul (local.get $i) (i32.const 32))))
        (local.set $at (i32.add (global.get $in) (i32.load (local.get $d))))
        (local.set $kl (i32.load offset=4 (local.get $d)))
        (local.set $op (i32.const 0))
        (if (i32.load offset=8 (local.get $d))
          (then (local.set $op (i32.load8_u (i32.add (local.get $at) (local.get $kl))))))
        (if (i32.eq (local.get $op) (i32.const 0x72)) (then   ;; r
          (i32.store offset=12 (local.get $d) (i32.const 5))
          (return (i32.const 5))))
        (if (i32.eq (local.get $op) (i32.const 0x74)) (then unreachable)) ;; t
        (if (i32.eq (local.get $op) (i32.const 0x62)) (then  ;; b
          (i32.store offset=4 (global.get $in) (i32.const 0))
          (drop (call $emit (local.get $at) (local.get $kl) (i32.const 0) (i32.const 0)))))
        (if (i32.eq (local.get $op) (i32.const 0x78)) (then  ;; x
          (i32.store offset=4 (global.get $in) (local.get $count))
          (drop (call $emit (local.get $at) (local.get $kl) (i32.const 0) (i32.const 0)))))
        (if (i32.eq (local.get $op) (i32.const 0x66)) (then  ;; f
          (loop $fill (br_if $fill (call $put (local.get $at) (local.get $kl) (i32.const 0x66) (local.get $i))))
          (drop (call $flush))))
        (if (i32.eq (local.get $op) (i32.const 0x65))
          (then  ;; e
            (i32.store8 (i32.const 2048) (i32.const 0x65))
            (i32.store8 (i32.const 2049) (i32.add (i32.const 0x30) (local.get $i)))
            (drop (call $emit (local.get $at) (local.get $kl) (i32.const 2048) (i32.const 2))))
          (else (drop (call $put (local.get $at) (local.get $kl) (i32.const 0x72) (local.get $i)))))
        (i32.store offset=24 (local.get $d) (i32.load (global.get $out)))
        (if (i32.eq (local.get $op) (i32.const 0x6F)) (then  ;; o
          (i32.store offset=24 (local.get $d) (i32.const 1000))))
        (if (i32.eq (local.get $op) (i32.const 0x6C)) (then  ;; l
          (i32.store offset=24 (local.get $d) (i32.const 0))))
        (if (i32.eq (local.get $op) (i32.const 0x70)) (then  ;; p
          (i32.store offset=24 (local.get $d) (i32.sub (i32.load (global.get $out)) (i32.add (local.get $kl) (i32.const 10))))))
        (if (i32.eq (local.get $op) (i32.const 0x67)) (then  ;; g
          (i32.store offset=12 (local.get $d) (i32.const 3))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (i32.const 0))
)
