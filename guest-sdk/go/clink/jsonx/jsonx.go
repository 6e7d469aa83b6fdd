// Package jsonx is a small allocation-free JSON toolkit for operators: read one field of a
// JSON object, parse integers, and append JSON strings and numbers to a buffer.
//
// It behaves exactly like the AssemblyScript SDK's json module, so that operators written
// in both languages produce byte-identical output:
//
//   - Field scans the top-level object only, takes the first field whose name matches, and
//     compares names with their raw JSON text (a name written with escapes is not matched).
//   - ParseInt accepts only JSON integers: -?(0|[1-9][0-9]*), within int64. No fraction, no
//     exponent, no leading '+' or zeros.
//   - AppendString escapes '"', '\\' and the control characters below U+0020 (as \b \t \n \f
//     \r, otherwise \u00XX in lowercase hex) and copies every other byte as is, so UTF-8 text
//     stays UTF-8 and nothing else (not '/', '<', '>', '&', U+2028) is escaped.
//
// Use encoding/json when you need a full decoder; it allocates and is much larger.
package jsonx

import (
	"strconv"
	"unicode/utf8"
)

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// skipString returns the index just past the string starting at b[i] == '"', or -1.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// skipValue returns the index just past the value starting at b[i], or -1 if it is malformed.
// Scalars are delimited, not validated; objects and arrays are matched bracket by bracket.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				if i < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	case ',', ':', '}', ']':
		return -1
	}
	start := i
	for i < len(b) && !isSpace(b[i]) && b[i] != ',' && b[i] != '}' && b[i] != ']' {
		i++
	}
	if i == start {
		return -1
	}
	return i
}

// Field returns the raw JSON text of the value of the first field called name in the object
// obj (for a string, including its quotes). ok is false if obj is not an object, is malformed
// before the field, or has no such field. raw points into obj.
func Field(obj []byte, name string) (raw []byte, ok bool) {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return nil, false
	}
	i++
	for {
		i = skipSpace(obj, i)
		if i >= len(obj) {
			return nil, false
		}
		if obj[i] == '}' {
			return nil, false
		}
		if obj[i] != '"' {
			return nil, false
		}
		end := skipString(obj, i)
		if end < 0 {
			return nil, false
		}
		match := string(obj[i+1:end-1]) == name
		i = skipSpace(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return nil, false
		}
		i = skipSpace(obj, i+1)
		vend := skipValue(obj, i)
		if vend < 0 {
			return nil, false
		}
		if match {
			return obj[i:vend], true
		}
		i = skipSpace(obj, vend)
		if i >= len(obj) {
			return nil, false
		}
		if obj[i] == ',' {
			i++
			continue
		}
		return nil, false
	}
}

// ParseInt parses a JSON integer: -?(0|[1-9][0-9]*) within int64. Anything else (a fraction,
// an exponent, a string, an out-of-range value) returns ok=false.
func ParseInt(raw []byte) (v int64, ok bool) {
	i, neg := 0, false
	if len(raw) > 0 && raw[0] == '-' {
		neg, i = true, 1
	}
	if i >= len(raw) || (raw[i] == '0' && len(raw) > i+1) {
		return 0, false
	}
	// Accumulate as a negative number: its range includes math.MinInt64.
	const min = -1 << 63
	var n int64
	for ; i < len(raw); i++ {
		c := raw[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if n < (min+d)/10 {
			return 0, false
		}
		n = n*10 - d
	}
	if !neg {
		if n == min {
			return 0, false
		}
		n = -n
	}
	return n, true
}

// FieldInt is Field followed by ParseInt.
func FieldInt(obj []byte, name string) (v int64, ok bool) {
	raw, ok := Field(obj, name)
	if !ok {
		return 0, false
	}
	return ParseInt(raw)
}

const hex = "0123456789abcdef"

// AppendString appends s as a JSON string, quotes included (escaping rules in the package
// documentation).
func AppendString(dst []byte, s []byte) []byte {
	// The common case, a string that needs no escape, is scanned eight bytes at a time and
	// copied with one append: in a WebAssembly guest every loop iteration and every call is
	// dear.
	i := 0
	for ; i+8 <= len(s); i += 8 {
		if needsEscape(word(s, i)) {
			break
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' {
			break
		}
	}
	if i == len(s) {
		n := len(dst)
		if cap(dst)-n >= len(s)+2 {
			dst = dst[:n+len(s)+2]
			dst[n] = '"'
			copy(dst[n+1:], s)
			dst[n+1+len(s)] = '"'
			return dst
		}
		dst = append(dst, '"')
		dst = append(dst, s...)
		return append(dst, '"')
	}
	return appendEscaped(dst, s, i)
}

// needsEscape reports whether any byte of w (eight bytes) is below 0x20, '"' or '\\'.
func needsEscape(w uint64) bool {
	// A byte b is below n when (b - n) borrows into its top bit while b's own top bit is 0;
	// equal to c when b^c is zero, so below 1. Written without helpers, to stay inlinable.
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	q, bs := w^(lo*'"'), w^(lo*'\\')
	return ((w-lo*0x20)&^w|(q-lo)&^q|(bs-lo)&^bs)&hi != 0
}

// appendEscaped is AppendString for a string whose bytes from first on may need escapes
// (s[:first] needs none).
func appendEscaped(dst []byte, s []byte, first int) []byte {
	dst = append(dst, '"')
	start := 0
	for i := first; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\r':
			dst = append(dst, '\\', 'r')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendUnquote appends the text of the JSON string raw (quotes included, as Field returns
// it), with its escapes decoded, to dst. ok is false if raw is not a well-formed JSON string.
// A \u escape of a lone surrogate decodes to U+FFFD, as encoding/json does; unlike it, bytes
// that are not valid UTF-8 are copied as they are.
func AppendUnquote(dst, raw []byte) (_ []byte, ok bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return dst, false
	}
	s := raw[1 : len(raw)-1]
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '"' || c < 0x20 {
			return dst, false
		}
		if c != '\\' {
			dst = append(dst, c)
			continue
		}
		i++
		if i == len(s) {
			return dst, false
		}
		switch s[i] {
		case '"', '\\', '/':
			dst = append(dst, s[i])
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, ok := hex4(s, i+1)
			if !ok {
				return dst, false
			}
			i += 4
			if r >= 0xD800 && r < 0xDC00 {
				// A high surrogate: combine with a following \uDC00-\uDFFF escape.
				if i+6 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
					if r2, ok := hex4(s, i+3); ok && r2 >= 0xDC00 && r2 < 0xE000 {
						r = 0x10000 + (r-0xD800)<<10 + (r2 - 0xDC00)
						i += 6
					} else {
						r = 0xFFFD
					}
				} else {
					r = 0xFFFD
				}
			} else if r >= 0xDC00 && r < 0xE000 {
				r = 0xFFFD
			}
			dst = utf8.AppendRune(dst, rune(r))
		default:
			return dst, false
		}
	}
	return dst, true
}

func hex4(s []byte, i int) (uint32, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var r uint32
	for _, c := range s[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | uint32(c)
	}
	return r, true
}

// AppendInt appends v in decimal, the only number format both SDKs produce identically.
//
// It writes the digits straight into dst's spare room when there is enough of it, without
// strconv's calls (each one costs tens of nanoseconds in a WebAssembly guest).
func AppendInt(dst []byte, v int64) []byte {
	n := len(dst)
	if cap(dst)-n < 20 {
		return strconv.AppendInt(dst, v, 10)
	}
	u := uint64(v)
	if v < 0 {
		u = -u
	}
	digits := 1
	for x := u; x >= 10; x /= 10 {
		digits++
	}
	if v < 0 {
		dst = dst[:n+1]
		dst[n] = '-'
		n++
	}
	dst = dst[:n+digits]
	for i := n + digits - 1; i > n; i-- {
		dst[i] = byte('0' + u%10)
		u /= 10
	}
	dst[n] = byte('0' + u)
	return dst
}
