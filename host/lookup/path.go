package lookup

import "strings"

// resolvePath maps a guest path (with an optional "?query") onto the endpoint: the result is
// root + the normalised guest path, and the normalised guest path must lie under prefix.
//
// The guest's "/" is the endpoint's root (the base URL's path), so a guest can neither climb
// above the root nor leave the prefix. Normalisation is deliberately stricter than RFC 3986:
//
//   - only pchar bytes (unreserved, sub-delims, ":", "@", "%XX") are allowed in segments;
//   - "." and ".." segments are resolved, also when written with %2e; a ".." above the root is
//     refused, and so is any result outside prefix;
//   - encoded slashes and backslashes (%2f, %5c), raw backslashes and double-encoded dots or
//     slashes (%252e, %252f, %255c) are refused outright: whether the upstream (or a proxy in
//     front of it) decodes them before routing is unknowable, and each has been used to escape
//     a prefix;
//   - empty segments ("//") are collapsed, so the path can never look like a network path.
//
// root is "" or a clean path without trailing slash; prefix is a clean path starting with "/".
// The returned path is in escaped form; rawQuery is passed through after validation.
func resolvePath(root, prefix, p string) (escaped, rawQuery string, err error) {
	if q := strings.IndexByte(p, '?'); q >= 0 {
		p, rawQuery = p[:q], p[q+1:]
		if !validQuery(rawQuery) {
			return "", "", refused(RulePath, "invalid query")
		}
	}
	if len(p) == 0 || p[0] != '/' {
		return "", "", refused(RulePath, "path must start with /")
	}
	// Fast path: nothing to normalise.
	clean := true
	for i := 1; i < len(p); i++ {
		c := p[i]
		if c == '/' {
			if p[i-1] == '/' {
				clean = false
				break
			}
			continue
		}
		// A dot matters only at the start of a segment ("." / ".." / ".%2e").
		if c == '%' || (c == '.' && p[i-1] == '/') || !isPathChar(c) {
			clean = false
			break
		}
	}
	var out string
	if clean {
		out = p
	} else {
		out, err = normalizePath(p)
		if err != nil {
			return "", "", err
		}
	}
	if !underPrefix(out, prefix) {
		return "", "", refused(RulePathPrefix, "path outside the endpoint's prefix")
	}
	if root == "" {
		return out, rawQuery, nil
	}
	return root + out, rawQuery, nil
}

// normalizePath is the slow path of resolvePath, for paths with dots, escapes or "//".
func normalizePath(p string) (string, error) {
	segs := make([]string, 0, 8)
	trailing := false
	rest := p[1:]
	for {
		var seg string
		i := strings.IndexByte(rest, '/')
		last := i < 0
		if last {
			seg = rest
		} else {
			seg, rest = rest[:i], rest[i+1:]
		}
		if err := checkSegment(seg); err != nil {
			return "", err
		}
		switch dotSegment(seg) {
		case 1: // "."
			trailing = last
		case 2: // ".."
			if len(segs) == 0 {
				return "", refused(RulePath, "path escapes the endpoint's root")
			}
			segs = segs[:len(segs)-1]
			trailing = last
		default:
			if seg == "" {
				trailing = last
			} else {
				segs = append(segs, seg)
				trailing = false
			}
		}
		if last {
			break
		}
	}
	var b strings.Builder
	n := 1
	for _, s := range segs {
		n += len(s) + 1
	}
	b.Grow(n)
	for _, s := range segs {
		b.WriteByte('/')
		b.WriteString(s)
	}
	if trailing || len(segs) == 0 {
		b.WriteByte('/')
	}
	return b.String(), nil
}

// checkSegment validates one path segment's bytes and escapes.
func checkSegment(s string) error {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '%' {
			if i+2 >= len(s) || !ishex(s[i+1]) || !ishex(s[i+2]) {
				return refused(RulePath, "invalid percent-encoding in path")
			}
			v := unhex(s[i+1])<<4 | unhex(s[i+2])
			switch v {
			case '/', '\\':
				return refused(RulePath, "encoded slash or backslash in path")
			case '%':
				// Double encoding of a dot or a separator.
				if i+4 < len(s) && ishex(s[i+3]) && ishex(s[i+4]) {
					switch unhex(s[i+3])<<4 | unhex(s[i+4]) {
					case '.', '/', '\\':
						return refused(RulePath, "double-encoded dot or slash in path")
					}
				}
			}
			i += 2
			continue
		}
		if c == '\\' {
			return refused(RulePath, "backslash in path")
		}
		if !isPathChar(c) {
			return refused(RulePath, "invalid byte in path")
		}
	}
	return nil
}

// dotSegment returns 1 for ".", 2 for "..", with "." also written "%2e" or "%2E"; 0 otherwise.
func dotSegment(s string) int {
	n := 0
	for i := 0; i < len(s); {
		switch {
		case s[i] == '.':
			i++
		case i+2 < len(s) && s[i] == '%' && s[i+1] == '2' && (s[i+2] == 'e' || s[i+2] == 'E'):
			i += 3
		default:
			return 0
		}
		n++
		if n > 2 {
			return 0
		}
	}
	return n
}

// underPrefix reports whether p equals prefix or lies under it at a segment boundary, so
// that prefix "/v1" admits "/v1" and "/v1/x" but not "/v1evil".
func underPrefix(p, prefix string) bool {
	if prefix == "/" || p == prefix {
		return true
	}
	if !strings.HasPrefix(p, prefix) {
		return false
	}
	return prefix[len(prefix)-1] == '/' || p[len(prefix)] == '/'
}

// isPathChar reports whether c is an RFC 3986 pchar byte other than '%' (unreserved,
// sub-delims, ':' and '@').
func isPathChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '-', '.', '_', '~', '!', '$', '&', '\'', '(', ')', '*', '+', ',', ';', '=', ':', '@':
		return true
	}
	return false
}

// validQuery accepts RFC 3986 query bytes (pchar, "/" and "?") with well-formed escapes.
func validQuery(q string) bool {
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '%':
			if i+2 >= len(q) || !ishex(q[i+1]) || !ishex(q[i+2]) {
				return false
			}
			i += 2
		case c == '/' || c == '?' || isPathChar(c):
		default:
			return false
		}
	}
	return true
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

// isCleanPath reports whether p, a configured path prefix or base path, is already in the
// form resolvePath produces, so that prefix comparisons are exact.
func isCleanPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	n, err := normalizePath(p)
	return err == nil && n == p
}
