(module
  (memory (export "memory") 1)
  ;; clink.manifest: {"abi":1,"name":"bad name!","states":["a","a"]}
  (func (export "clink_input") (param i32) (result i32) (i32.const 4096))
  (func (export "clink_process") (param i32 i32 i64) (result i32) (i32.const 0)))
