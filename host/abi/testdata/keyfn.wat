;; keyfn: key function returning the first 3 bytes of the value (or rejecting values shorter
;; than 3), and a process that emits the key it got as a JSON string.
(module
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; clink.manifest: {"abi":1,"name":"keyfn"}
  (func (export "clink_input") (param i32) (result i32) (i32.const 4096))
  (func (export "clink_key") (param $vl i32) (result i64)
    (if (i32.lt_u (local.get $vl) (i32.const 3)) (then (return (i64.const -1))))
    (i64.or (i64.shl (i64.const 4096) (i64.const 32)) (i64.const 3)))
  (func (export "clink_process") (param $kl i32) (param $vl i32) (param i64) (result i32)
    (i32.store8 (i32.const 100) (i32.const 34))
    (memory.copy (i32.const 101) (i32.const 4096) (local.get $kl))
    (i32.store8 (i32.add (i32.const 101) (local.get $kl)) (i32.const 34))
    (call $emit (i32.const 4096) (local.get $kl) (i32.const 100) (i32.add (local.get $kl) (i32.const 2)))))
