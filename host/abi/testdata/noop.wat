;; noop: clink_process does nothing: the floor of an export call, for BenchmarkProcess.
(module
  (memory (export "memory") 1)
  ;; clink.manifest: {"abi":1,"name":"noop"}
  (func (export "clink_input") (param i32) (result i32) (i32.const 4096))
  (func (export "clink_process") (param i32 i32 i64) (result i32) (i32.const 0)))
