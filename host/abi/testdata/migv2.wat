;; migv2: state version 2 of migv1's counter, migrated by the host through clink_migrate.
;; State "count" now holds 16 bytes: the count (u64 LE), then the format tag 2 (u64 LE). A
;; value in any other form is an unmigrated one: the record fails with code 9. Each record
;; emits {"count":N,"v":2} with its key.
;;
;; clink_migrate converts a version-1 value (8 bytes) of state 0 into the version-2 form,
;; keeping the count. For testing, the key "drop" is dropped (-1: the entry is deleted) and the
;; key "poison" traps, after logging "cannot migrate poison".
;; clink.manifest: {"abi":1,"name":"migcount","states":["count"],"state_version":2,"migrates_from":[1]}
(module
  (import "clink_v1" "get_async" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "put" (func $put (param i32 i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "emit" (func $emit (param i32 i32 i32 i32) (result i32)))
  (import "clink_v1" "log" (func $log (param i32 i32 i32)))
  (memory (export "memory") 2)
  (data (i32.const 200) "poison")
  (data (i32.const 210) "drop")
  (data (i32.const 220) "cannot migrate poison")
  (data (i32.const 512) "{\"count\":")
  (func (export "clink_input") (param $cap i32) (result i32)
    (if (i32.gt_u (local.get $cap) (i32.const 65536)) (then (return (i32.const 0))))
    (i32.const 65536))
  ;; $is: whether the n bytes at $a equal the n bytes at $b
  (func $is (param $a i32) (param $b i32) (param $n i32) (result i32)
    (local $i i32)
    (loop $l
      (if (i32.ge_u (local.get $i) (local.get $n)) (then (return (i32.const 1))))
      (if (i32.ne (i32.load8_u (i32.add (local.get $a) (local.get $i))) (i32.load8_u (i32.add (local.get $b) (local.get $i))))
        (then (return (i32.const 0))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l))
    (i32.const 0))
  (func $itoa (param $v i64) (param $p i32) (result i32)
    (local $q i32) (local $n i32) (local $t i64)
    (local.set $t (local.get $v)) (local.set $n (i32.const 1))
    (block $d (loop $l
      (local.set $t (i64.div_u (local.get $t) (i64.const 10)))
      (br_if $d (i64.eqz (local.get $t)))
      (local.set $n (i32.add (local.get $n) (i32.const 1)))
      (br $l)))
    (local.set $q (i32.add (local.get $p) (local.get $n)))
    (local.set $p (local.get $q))
    (loop $w
      (local.set $p (i32.sub (local.get $p) (i32.const 1)))
      (i32.store8 (local.get $p) (i32.add (i32.const 48) (i32.wrap_i64 (i64.rem_u (local.get $v) (i64.const 10)))))
      (local.set $v (i64.div_u (local.get $v) (i64.const 10)))
      (br_if $w (i64.ne (local.get $v) (i64.const 0))))
    (local.get $q))
  (func (export "clink_migrate") (param $state i32) (param $from i32) (param $kl i32) (param $el i32) (param $vl i32) (result i64)
    (if (i32.or (i32.ne (local.get $state) (i32.const 0)) (i32.ne (local.get $from) (i32.const 1))) (then unreachable))
    (if (i32.and (i32.eq (local.get $kl) (i32.const 6)) (call $is (i32.const 65536) (i32.const 200) (i32.const 6)))
      (then
        (call $log (i32.const 3) (i32.const 220) (i32.const 21))
        unreachable))
    (if (i32.and (i32.eq (local.get $kl) (i32.const 4)) (call $is (i32.const 65536) (i32.const 210) (i32.const 4)))
      (then (return (i64.const -1))))
    (if (i32.or (i32.ne (local.get $el) (i32.const 0)) (i32.ne (local.get $vl) (i32.const 8))) (then unreachable))
    (i64.store (i32.const 4096) (i64.load (i32.add (i32.const 65536) (local.get $kl))))
    (i64.store (i32.const 4104) (i64.const 2))
    (i64.or (i64.shl (i64.const 4096) (i64.const 32)) (i64.const 16)))
  (func (export "clink_process") (param $kl i32) (param $vl i32) (param $ts i64) (result i32)
    (local $r i32) (local $end i32)
    (local.set $r (call $get (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 1024) (i32.const 16)))
    (if (i32.lt_s (local.get $r) (i32.const 0))
      (then (i64.store (i32.const 1024) (i64.const 0)))
      (else
        (if (i32.or (i32.ne (local.get $r) (i32.const 16)) (i64.ne (i64.load (i32.const 1032)) (i64.const 2)))
          (then (return (i32.const 9))))))
    (i64.store (i32.const 1024) (i64.add (i64.load (i32.const 1024)) (i64.const 1)))
    (i64.store (i32.const 1032) (i64.const 2))
    (drop (call $put (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 1024) (i32.const 16)))
    (local.set $end (call $itoa (i64.load (i32.const 1024)) (i32.const 521)))
    (i64.store align=1 (local.get $end) (i64.const 0x7D323A2276222C)) ;; ,"v":2}
    (call $emit (i32.const 65536) (local.get $kl) (i32.const 512) (i32.sub (i32.add (local.get $end) (i32.const 7)) (i32.const 512))))
)
