;; Exception handling with exnref (try_table, throw, throw_ref), which wazero
;; supports behind experimental.CoreFeaturesExceptionHandling. Needs wabt >= 1.0.37
;; (see gen.sh); legacy try/catch wazero rejects, and so does the rewrite.
(module
  (tag $e (param i32))
  (func $thrower (param i32)
    (if (i32.gt_s (local.get 0) (i32.const 10)) (then (throw $e (local.get 0)))))

  ;; catch returns the thrown value, or -1 if nothing was thrown.
  (func (export "catch") (param i32) (result i32)
    (block $h (result i32)
      (try_table (catch $e $h)
        (call $thrower (local.get 0)))
      (i32.const -1)))

  ;; rethrow catches everything as an exnref, rethrows it with throw_ref and
  ;; catches it again by tag.
  (func (export "rethrow") (param i32) (result i32)
    (block $outer (result i32)
      (try_table (catch $e $outer)
        (block $h (result exnref)
          (try_table (catch_all_ref $h)
            (call $thrower (local.get 0)))
          (return (i32.const -2)))
        (throw_ref))
      (i32.const -3)))

  ;; retry_loop throws inside a loop $n-1 times; a catch_all clause branches
  ;; straight back to the loop header, where the fuel check sits.
  (func (export "retry_loop") (param $n i32) (result i32)
    (local $tries i32)
    (loop $retry
      (local.set $tries (i32.add (local.get $tries) (i32.const 1)))
      (try_table (catch_all $retry)
        (if (i32.lt_s (local.get $tries) (local.get $n))
          (then (call $thrower (i32.const 11))))))
    (local.get $tries)))
