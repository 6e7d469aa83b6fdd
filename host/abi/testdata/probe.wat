;; probe: a conformance module that executes a "script" from the record value, calling any
;; clink_v1 import with arbitrary arguments, and emits the results. Used by the conformance
;; tests and the fuzzer: the guest may pass any pointer and length.
;;
;; Memory: 2 pages. Input buffer at 65536 (cap 16384). Results at 98304 (8 bytes each).
;; Script entry (48 bytes): op i64, a i64, b i64, c i64, d i64, e i64.
;;   op 0 get_async(a,b,c,d,e)  1 put(a,b,c,d,e)  2 delete(a,b,c)  3 take_result(a,b)
;;   4 emit(a,b,c,d)  5 timer_register(a)  6 timer_delete(a)  7 watermark()
;;   8 processing_time()  9 log(a,b,c)  10 lookup(a,b,c,d,e)  11 memory.grow(a)
;;   12 store8 mem[a] = b   13 output_area(a,b)   14 flush_output()   other: unreachable
(module
  (import "clink_v1" "get_async" (func $get_async (param i32 i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "put" (func $put (param i32 i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "delete" (func $delete (param i32 i32 i32) (result i32)))
  (import "clink_v1" "take_result" (func $take (param i32 i32) (result i32)))
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "timer_register" (func $treg (param i64) (result i32)))
  (import "clink_v1" "timer_delete" (func $tdel (param i64) (result i32)))
  (import "clink_v1" "watermark" (func $wm (result i64)))
  (import "clink_v1" "processing_time" (func $pt (result i64)))
  (import "clink_v1" "log" (func $log (param i32 i32 i32)))
  (import "clink_v1" "lookup" (func $lookup (param i32 i32 i32 i32 i32) (result i64)))
  (import "clink_v1" "output_area" (func $oarea (param i32 i32) (result i32)))
  (import "clink_v1" "flush_output" (func $oflush (result i32)))
  (memory (export "memory") 2)
  ;; clink.manifest: {"abi":1,"name":"probe","states":["s0","s1"],"endpoints":["ep"]}

  (func (export "clink_input") (param $cap i32) (result i32)
    (if (i32.gt_u (local.get $cap) (i32.const 16384)) (then (return (i32.const 0))))
    (i32.const 65536))

  (func $arg (param $p i32) (param $i i32) (result i64)
    (i64.load (i32.add (local.get $p) (i32.mul (i32.add (local.get $i) (i32.const 1)) (i32.const 8)))))

  (func $run (param $p i32) (param $n i32)
    (local $i i32) (local $op i64) (local $r i64)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $op (i64.load (local.get $p)))
        (local.set $r (i64.const 0))
        (block $sw
        (block $c14 (block $c13 (block $c12 (block $c11 (block $c10 (block $c9 (block $c8 (block $c7 (block $c6 (block $c5 (block $c4 (block $c3 (block $c2 (block $c1 (block $c0 (block $bad
          (br_table $c0 $c1 $c2 $c3 $c4 $c5 $c6 $c7 $c8 $c9 $c10 $c11 $c12 $c13 $c14 $bad
            (i32.wrap_i64 (select (local.get $op) (i64.const 15) (i64.lt_u (local.get $op) (i64.const 15))))))
          unreachable)
          (local.set $r (i64.extend_i32_s (call $get_async (i32.wrap_i64 (call $arg (local.get $p) (i32.const 0))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 1))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 2))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 3))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 4))))))
          (br $sw))
          (local.set $r (i64.extend_i32_s (call $put (i32.wrap_i64 (call $arg (local.get $p) (i32.const 0))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 1))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 2))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 3))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 4))))))
          (br $sw))
          (local.set $r (i64.extend_i32_s (call $delete (i32.wrap_i64 (call $arg (local.get $p) (i32.const 0))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 1))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 2))))))
          (br $sw))
          (local.set $r (i64.extend_i32_s (call $take (i32.wrap_i64 (call $arg (local.get $p) (i32.const 0))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 1))))))
          (br $sw))
          (local.set $r (i64.extend_i32_s (call $emit (i32.wrap_i64 (call $arg (local.get $p) (i32.const 0))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 1))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 2))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 3))))))
          (br $sw))
          (local.set $r (i64.extend_i32_s (call $treg (call $arg (local.get $p) (i32.const 0)))))
          (br $sw))
          (local.set $r (i64.extend_i32_s (call $tdel (call $arg (local.get $p) (i32.const 0)))))
          (br $sw))
          (local.set $r (call $wm))
          (br $sw))
          (local.set $r (call $pt))
          (br $sw))
          (call $log (i32.wrap_i64 (call $arg (local.get $p) (i32.const 0))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 1))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 2))))
          (br $sw))
          (local.set $r (call $lookup (i32.wrap_i64 (call $arg (local.get $p) (i32.const 0))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 1))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 2))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 3))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 4)))))
          (br $sw))
          (local.set $r (i64.extend_i32_s (memory.grow (i32.wrap_i64 (call $arg (local.get $p) (i32.const 0))))))
          (br $sw))
          (i32.store8 (i32.wrap_i64 (call $arg (local.get $p) (i32.const 0))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 1))))
          (br $sw))
          (local.set $r (i64.extend_i32_s (call $oarea (i32.wrap_i64 (call $arg (local.get $p) (i32.const 0))) (i32.wrap_i64 (call $arg (local.get $p) (i32.const 1))))))
          (br $sw))
          (local.set $r (i64.extend_i32_s (call $oflush)))
          (br $sw))
        (i64.store (i32.add (i32.const 98304) (i32.mul (local.get $i) (i32.const 8))) (local.get $r))
        (local.set $p (i32.add (local.get $p) (i32.const 48)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next))))

  (func $script (param $kl i32) (param $vl i32)
    (local $n i32)
    (local.set $n (i32.div_u (local.get $vl) (i32.const 48)))
    (if (i32.gt_u (local.get $n) (i32.const 512)) (then (local.set $n (i32.const 512))))
    (call $run (i32.add (i32.const 65536) (local.get $kl)) (local.get $n))
    (drop (call $emit (i32.const 0) (i32.const 0) (i32.const 98304) (i32.mul (local.get $n) (i32.const 8)))))

  (func (export "clink_process") (param $kl i32) (param $vl i32) (param $ts i64) (result i32)
    (call $script (local.get $kl) (local.get $vl))
    (i32.const 0))

  ;; on_timer: emit the key and timestamp so tests can see it fired.
  (func (export "clink_on_timer") (param $kl i32) (param $ts i64) (result i32)
    (i64.store (i32.const 98304) (local.get $ts))
    (drop (call $emit (i32.const 65536) (local.get $kl) (i32.const 98304) (i32.const 8)))
    (i32.const 0))
)
