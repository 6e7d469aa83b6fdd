package clink

import (
	"strconv"

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

// Logf formats a message and logs it. It understands a subset of package fmt, so that the SDK
// does not link fmt (and through it os and most of WASI) into every module: the verbs %v, %s,
// %d, %x, %q, %t and %%, applied to strings, byte slices, integers, floats, bools, errors and
// values with a String method. Anything else prints as %!v(unsupported). Operators that need
// full formatting can use fmt.Sprintf with Log, at the cost of a larger module.
func Logf(level Level, format string, args ...any) {
	logBuf = appendf(logBuf[:0], format, args)
	abi.Log(int32(level), abi.Ptr(logBuf), uint32(len(logBuf)))
	if cap(logBuf) > 64<<10 {
		logBuf = nil // do not pin a huge buffer after one large message
	}
}

func appendf(b []byte, format string, args []any) []byte {
	next := 0
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			b = append(b, c)
			continue
		}
		i++
		verb := format[i]
		if verb == '%' {
			b = append(b, '%')
			continue
		}
		if next >= len(args) {
			b = append(b, "%!"...)
			b = append(b, verb)
			b = append(b, "(MISSING)"...)
			continue
		}
		b = appendArg(b, verb, args[next])
		next++
	}
	if next < len(args) {
		b = append(b, "%!(EXTRA)"...)
	}
	return b
}

func appendArg(b []byte, verb byte, a any) []byte {
	var s string
	switch v := a.(type) {
	case nil:
		s = "<nil>"
	case string:
		s = v
	case []byte:
		if verb == 'x' {
			const hex = "0123456789abcdef"
			for _, c := range v {
				b = append(b, hex[c>>4], hex[c&0xf])
			}
			return b
		}
		s = string(v)
	case error:
		s = v.Error()
	case interface{ String() string }:
		s = v.String()
	case bool:
		return strconv.AppendBool(b, v)
	case int:
		return appendInt(b, verb, int64(v))
	case int8:
		return appendInt(b, verb, int64(v))
	case int16:
		return appendInt(b, verb, int64(v))
	case int32:
		return appendInt(b, verb, int64(v))
	case int64:
		return appendInt(b, verb, v)
	case uint:
		return appendUint(b, verb, uint64(v))
	case uint8:
		return appendUint(b, verb, uint64(v))
	case uint16:
		return appendUint(b, verb, uint64(v))
	case uint32:
		return appendUint(b, verb, uint64(v))
	case uint64:
		return appendUint(b, verb, v)
	case uintptr:
		return appendUint(b, verb, uint64(v))
	case float32:
		return strconv.AppendFloat(b, float64(v), 'g', -1, 32)
	case float64:
		return strconv.AppendFloat(b, v, 'g', -1, 64)
	default:
		return append(b, "%!v(unsupported)"...)
	}
	if verb == 'q' {
		return strconv.AppendQuote(b, s)
	}
	return append(b, s...)
}

func appendInt(b []byte, verb byte, v int64) []byte {
	if verb == 'x' {
		return strconv.AppendInt(b, v, 16)
	}
	return strconv.AppendInt(b, v, 10)
}

func appendUint(b []byte, verb byte, v uint64) []byte {
	if verb == 'x' {
		return strconv.AppendUint(b, v, 16)
	}
	return strconv.AppendUint(b, v, 10)
}
