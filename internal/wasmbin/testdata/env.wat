;; env is not instrumented: it stands in for the host, providing the imports of
;; calls.wat and elems.wat (wazero host modules cannot export globals or
;; memories).
(module
  (memory (export "memory") 1)
  (global (export "base") i32 (i32.const 5))
  (global (export "counter") (mut i32) (i32.const 100))
  (func (export "double") (param i32) (result i32) (i32.shl (local.get 0) (i32.const 1)))
  (func (export "triple") (param i32) (result i32) (i32.mul (local.get 0) (i32.const 3)))
  (func (export "ten") (result i32) (i32.const 10)))
