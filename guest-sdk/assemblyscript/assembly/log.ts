// Logging to the operator's log (docs/abi.md, "log").

import * as abi from "./abi";
import { Buffer } from "./bytes";

export const enum Level {
  Debug = 0,
  Info = 1,
  Warn = 2,
  Error = 3,
}

const logBuffer = new Buffer();

/** Writes a line to the operator's log at the given level. */
export function write(level: Level, msg: string): void {
  logBuffer.clear().append(msg);
  abi.log(<i32>level, logBuffer.ptr, <u32>logBuffer.length);
  if (logBuffer.capacity > 65536) logBuffer.release();
}

export function debug(msg: string): void { write(Level.Debug, msg); }
export function info(msg: string): void { write(Level.Info, msg); }
export function warn(msg: string): void { write(Level.Warn, msg); }
/** Logs at error level. The last error-level line of a failing call is attached to the host's fault report. */
export function error(msg: string): void { write(Level.Error, msg); }
