;; memfill: a runaway that uses what it allocates. It grows memory 16 pages (1 MiB) at a time
;; and fills each new megabyte until memory.grow is refused, then traps writing past the end.
;; Unlike membomb, every page it is granted becomes resident.
(module
  (memory (export "memory") 1)
  ;; clink.manifest: {"abi":1,"name":"memfill"}
  (func (export "clink_input") (param i32) (result i32) (i32.const 4096))
  (func (export "clink_process") (param i32 i32 i64) (result i32)
    (local $old i32)
    (block $full (loop $grow
      (local.set $old (memory.grow (i32.const 16)))
      (br_if $full (i32.eq (local.get $old) (i32.const -1)))
      (memory.fill (i32.mul (local.get $old) (i32.const 65536)) (i32.const 0xab) (i32.const 0x100000))
      (br $grow)))
    (i32.store (i32.mul (memory.size) (i32.const 65536)) (i32.const 1))
    (i32.const 0)))
