// The guest ABI v1 exports. Re-export them from your entry file:
//
//     export * from "@clink-wasm/sdk/assembly/exports";
//
// (memory is exported by the compiler; _initialize by --exportStart _initialize.)
export { clink_input, clink_process, clink_process_batch, clink_on_timer, clink_open, clink_close, clink_manifest } from "./operator";
