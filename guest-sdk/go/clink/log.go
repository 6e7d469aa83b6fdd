package clink

import (
	"fmt"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"
)

// Level is a log level.
type Level int32

// Log levels (docs/abi.md, "log").
const (
	LevelDebug Level = 0
	LevelInfo  Level = 1
	LevelWarn  Level = 2
	LevelError Level = 3
)

// Log writes msg to the operator's log. The host truncates messages over 16 KiB. The last
// error-level message of a failing call is attached to the host's fault report.
func Log(level Level, msg string) {
	abi.Log(int32(level), abi.StrPtr(msg), uint32(len(msg)))
}

var logBuf []byte

// Logf formats with fmt.Appendf into a reused buffer and logs the result.
func Logf(level Level, format string, args ...any) {
	logBuf = fmt.Appendf(logBuf[:0], format, args...)
	abi.Log(int32(level), abi.Ptr(logBuf), uint32(len(logBuf)))
	if cap(logBuf) > 64<<10 {
		logBuf = nil // do not pin a huge buffer after one large message
	}
}
