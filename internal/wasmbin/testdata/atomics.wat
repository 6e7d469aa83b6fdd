;; Threads proposal: shared memory and atomic instructions (0xfe prefix with
;; memory operands, and atomic.fence).
(module
  (memory (export "memory") 1 1 shared)

  ;; add_loop atomically adds 1 to memory[0] n times and returns the value.
  (func (export "add_loop") (param $n i32) (result i32)
    (loop $l
      (drop (i32.atomic.rmw.add (i32.const 0) (i32.const 1)))
      (br_if $l (local.tee $n (i32.sub (local.get $n) (i32.const 1)))))
    (atomic.fence)
    (i32.atomic.load (i32.const 0)))

  ;; cas swaps memory[8] from $old to $new and returns what was there.
  (func (export "cas") (param $old i64) (param $new i64) (result i64)
    (i64.atomic.rmw.cmpxchg offset=8 (i32.const 0) (local.get $old) (local.get $new)))

  ;; notify wakes no one and returns 0; wait times out at once (returns 2).
  (func (export "notify_wait") (result i32)
    (i32.add
      (memory.atomic.notify (i32.const 16) (i32.const 1))
      (memory.atomic.wait32 (i32.const 16) (i32.const 0) (i64.const 0))))

  (func (export "narrow") (result i32)
    (i32.atomic.store8 (i32.const 24) (i32.const 0x1ff))
    (i32.atomic.rmw8.xchg_u (i32.const 24) (i32.const 3))))
