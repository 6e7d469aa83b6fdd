;; membomb: grows memory 16 pages at a time until refused, then traps writing past the end.
(module
  (memory (export "memory") 1)
  ;; clink.manifest: {"abi":1,"name":"membomb"}
  (func (export "clink_input") (param i32) (result i32) (i32.const 4096))
  (func (export "clink_process") (param i32 i32 i64) (result i32)
    (block $full (loop $grow
      (br_if $full (i32.eq (memory.grow (i32.const 16)) (i32.const -1)))
      (br $grow)))
    (i32.store (i32.mul (memory.size) (i32.const 65536)) (i32.const 1))
    (i32.const 0)))
