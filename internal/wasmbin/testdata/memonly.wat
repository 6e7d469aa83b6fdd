;; Memory, data and an export but no type, import, global, function or code
;; section.
(module
  (memory (export "memory") 1)
  (data (i32.const 16) "hello"))
