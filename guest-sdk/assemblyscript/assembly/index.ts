// The clink-wasm AssemblyScript SDK (guest ABI v1, docs/abi.md).
//
//     import { Operator, Record, State, register, emit, Buffer } from "@clink-wasm/sdk/assembly";
//     export * from "@clink-wasm/sdk/assembly/exports";
//
// See README.md for a complete example and the build command.

export { Code, ABI_VERSION } from "./abi";
export { Bytes, Buffer } from "./bytes";
export { Record, Operator, register, name } from "./operator";
export { State, StateOptions } from "./state";
export { Endpoint, Header, Response } from "./lookup";
export { emit, registerTimer, deleteTimer, registerProcessingTimer, deleteProcessingTimer, setResumeOrder, watermark, processingTime, WATERMARK_NONE, WATERMARK_END } from "./core";
export { setKeyFunction } from "./keyfunc";
export { JsonValue } from "./json";
import * as json from "./json";
import * as log from "./log";
export { json, log };
export { Level } from "./log";
