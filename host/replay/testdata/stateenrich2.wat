;; stateenrich2: stateenrich with a deliberate change: from the third record of a key on
;; (count >= 2) it emits nothing. Otherwise it keeps a per-key count in state "count" (an i64, read with get_async: a cold read
;; after a restore), POSTs the record value to /enrich?n=D on endpoint "svc" (D = count mod 10),
;; writes count+1 and emits the response body ({"lookup_error":true} if the lookup failed).
;; clink.manifest: {"abi":1,"name":"stateenrich2","states":["count"],"endpoints":["svc"]}
(module
  (import "clink_v1" "get_async" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "put" (func $put (param i32 i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "lookup" (func $lookup (param i32 i32 i32 i32 i32) (result i64)))
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 4)
  (data (i32.const 0) "POST /enrich?n=0\n\n")
  (data (i32.const 64) "{\"lookup_error\":true}")
  ;; state value at 512, request at 1024 (18-byte head, then the value), input at 65536,
  ;; response at 131072.
  (func (export "clink_input") (param $cap i32) (result i32)
    (if (i32.gt_u (local.get $cap) (i32.const 60000)) (then (return (i32.const 0))))
    (i32.const 65536))
  (func (export "clink_process") (param $kl i32) (param $vl i32) (param $ts i64) (result i32)
    (local $n i64) (local $r i64)
    (if (i32.lt_s (call $get (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 512) (i32.const 8)) (i32.const 0))
      (then (i64.store (i32.const 512) (i64.const 0))))
    (local.set $n (i64.load (i32.const 512)))
    (memory.copy (i32.const 1024) (i32.const 0) (i32.const 18))
    (i32.store8 (i32.const 1039) (i32.add (i32.const 48) (i32.wrap_i64 (i64.rem_u (local.get $n) (i64.const 10)))))
    (memory.copy (i32.const 1042) (i32.add (i32.const 65536) (local.get $kl)) (local.get $vl))
    (local.set $r (call $lookup (i32.const 0) (i32.const 1024) (i32.add (i32.const 18) (local.get $vl))
                                (i32.const 131072) (i32.const 65536)))
    (i64.store (i32.const 512) (i64.add (local.get $n) (i64.const 1)))
    (drop (call $put (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 512) (i32.const 8)))
    (if (i64.lt_s (local.get $r) (i64.const 0))
      (then (return (call $emit (i32.const 65536) (local.get $kl) (i32.const 64) (i32.const 21)))))
    (if (i64.ge_u (local.get $n) (i64.const 2)) (then (return (i32.const 0))))
    (call $emit (i32.const 65536) (local.get $kl) (i32.const 131072) (i32.wrap_i64 (local.get $r))))
)
