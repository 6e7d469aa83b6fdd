package jsonfield

// Valid reports whether b is one JSON value with optional whitespace around it, exactly as
// encoding/json.Valid does (FuzzValid checks it against the standard library): RFC 8259's
// grammar, strings of any bytes but the control characters (invalid UTF-8 and lone
// surrogates included, as encoding/json accepts them), and at most 10,000 nested arrays and
// objects. The sources run it on every record; it makes one pass without the scanner's
// per-byte state function calls.
func Valid(b []byte) bool {
	// The containers open at i: bit d of stack is 1 for an object at depth d+1, 0 for an array.
	var inline [4]uint64
	stack := inline[:]
	depth := 0
	i := skipSpace(b, 0)
value:
	if i >= len(b) {
		return false
	}
	switch c := b[i]; {
	case c == '{' || c == '[':
		if depth == maxNesting {
			return false
		}
		if depth/64 == len(stack) {
			stack = append(stack, 0)
		}
		if c == '{' {
			stack[depth/64] |= 1 << (depth % 64)
		} else {
			stack[depth/64] &^= 1 << (depth % 64)
		}
		depth++
		i = skipSpace(b, i+1)
		if i >= len(b) {
			return false
		}
		if c == '{' {
			if b[i] == '}' {
				depth--
				i++
				goto after
			}
			goto key
		}
		if b[i] == ']' {
			depth--
			i++
			goto after
		}
		goto value
	case c == '"':
		if i = validString(b, i); i < 0 {
			return false
		}
	case c == '-' || c >= '0' && c <= '9':
		if i = skipNumber(b, i); i < 0 {
			return false
		}
	case c == 't':
		if i = skipLiteral(b, i, "true"); i < 0 {
			return false
		}
	case c == 'f':
		if i = skipLiteral(b, i, "false"); i < 0 {
			return false
		}
	case c == 'n':
		if i = skipLiteral(b, i, "null"); i < 0 {
			return false
		}
	default:
		return false
	}
after:
	i = skipSpace(b, i)
	if depth == 0 {
		return i == len(b)
	}
	if i >= len(b) {
		return false
	}
	switch inObject := stack[(depth-1)/64]&(1<<((depth-1)%64)) != 0; b[i] {
	case ',':
		i = skipSpace(b, i+1)
		if inObject {
			goto key
		}
		goto value
	case '}':
		if !inObject {
			return false
		}
	case ']':
		if inObject {
			return false
		}
	default:
		return false
	}
	depth--
	i++
	goto after
key:
	if i >= len(b) || b[i] != '"' {
		return false
	}
	if i = validString(b, i); i < 0 {
		return false
	}
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return false
	}
	i = skipSpace(b, i+1)
	goto value
}

// maxNesting is encoding/json's bound on nested arrays and objects.
const maxNesting = 10000

// stringStop marks the bytes a string's scan stops at: control characters, the quote and the
// backslash.
var stringStop = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// skipString returns the index after the string that starts at b[i] (a quote), or -1.
func validString(b []byte, i int) int {
	i++
	for {
		for i < len(b) && !stringStop[b[i]] {
			i++
		}
		if i >= len(b) {
			return -1
		}
		switch b[i] {
		case '"':
			return i + 1
		case '\\':
			if i+1 >= len(b) {
				return -1
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return -1
				}
				i += 6
			default:
				return -1
			}
		default: // a control character
			return -1
		}
	}
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// skipNumber returns the index after the number that starts at b[i], or -1.
func skipNumber(b []byte, i int) int {
	if b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return -1
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i+1)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// skipLiteral returns the index after lit at b[i], or -1.
func skipLiteral(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}
