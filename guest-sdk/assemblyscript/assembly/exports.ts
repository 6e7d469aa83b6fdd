// The guest ABI v1 exports. Re-export them from your entry file:
//
//     export * from "@clink-wasm/sdk/assembly/exports";
//
// (memory is exported by the compiler; _initialize by --exportStart _initialize.)
export { clink_input, clink_process, clink_on_timer, clink_open, clink_close, clink_manifest } from "./operator";

// clink_process_batch (docs/abi.md, "Batch calls") is opt-in: re-export it from operator.ts,
//
//     export { clink_process_batch } from "@clink-wasm/sdk/assembly/operator";
//
// to let the host hand several records of distinct keys to one call. An AssemblyScript
// export call is cheap, and for the counter example batches cost more than they save (1.27x
// the CPU per record in host/scheduler BenchmarkCallBatch, and the hot-path figure 1.30
// instead of 1.04: docs/BENCHMARKS.md, "Issue 11, session 11"), so it is not exported by
// default.
