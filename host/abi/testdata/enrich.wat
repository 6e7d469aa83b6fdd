;; enrich: POSTs each record to endpoint "svc" at /enrich and emits the response body, which
;; the test server makes JSON. A lookup error code c is emitted as {"lookup_error":-c} (c is a
;; negative ABI code, so -c is 16..21).
;; clink.manifest: {"abi":1,"name":"enrich","endpoints":["svc"]}
(module
  (import "clink_v1" "lookup" (func $lookup (param i32 i32 i32 i32 i32) (result i64)))
  (import "clink_v1" "take_result" (func $take (param i32 i32) (result i32)))
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 4)
  (data (i32.const 0) "POST /enrich\n\n")
  (data (i32.const 64) "{\"lookup_error\":00}")
  ;; request buffer at 1024: the 14-byte head, then the value; input buffer at 65536.
  (func (export "clink_input") (param $cap i32) (result i32)
    (if (i32.gt_u (local.get $cap) (i32.const 65536)) (then (return (i32.const 0))))
    (i32.const 65536))
  (func (export "clink_process") (param $kl i32) (param $vl i32) (param $ts i64) (result i32)
    (local $r i64) (local $n i32) (local $c i32)
    (memory.copy (i32.const 1024) (i32.const 0) (i32.const 14))
    (memory.copy (i32.const 1038) (i32.add (i32.const 65536) (local.get $kl)) (local.get $vl))
    (local.set $r (call $lookup (i32.const 0) (i32.const 1024) (i32.add (i32.const 14) (local.get $vl))
                                (i32.const 131072) (i32.const 65536)))
    (if (i64.lt_s (local.get $r) (i64.const 0))
      (then
        (local.set $c (i32.sub (i32.const 0) (i32.wrap_i64 (local.get $r))))
        (i32.store8 (i32.const 80) (i32.add (i32.const 48) (i32.div_u (local.get $c) (i32.const 10))))
        (i32.store8 (i32.const 81) (i32.add (i32.const 48) (i32.rem_u (local.get $c) (i32.const 10))))
        (return (call $emit (i32.const 65536) (local.get $kl) (i32.const 64) (i32.const 19)))))
    (local.set $n (i32.wrap_i64 (local.get $r)))
    (call $emit (i32.const 65536) (local.get $kl) (i32.const 131072) (local.get $n)))
)
