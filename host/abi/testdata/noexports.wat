(module
  (memory 1)
  ;; clink.manifest: {"abi":1,"name":"empty"}
)
