package scheduler

import (
	"fmt"
	"io"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// WriterLog returns a LogFunc that writes each guest log line to w as
// "[operator] level: message (where)", where is describe(pos) of the record the line came from,
// or the timer's timestamp; nil if w is nil (the lines are dropped). Runs and replays share it,
// so a line reads the same in both.
func WriterLog(w io.Writer, describe func(pos int64) string) LogFunc {
	if w == nil {
		return nil
	}
	return func(op string, level abi.LogLevel, msg []byte, src *Source) {
		where := ""
		if src != nil {
			if src.Timer {
				where = fmt.Sprintf(" (timer at %d)", src.TS)
			} else {
				where = " (" + describe(src.Pos) + ")"
			}
		}
		fmt.Fprintf(w, "[%s] %s: %s%s\n", op, level, msg, where)
	}
}
