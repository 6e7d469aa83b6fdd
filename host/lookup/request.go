package lookup

import (
	"bytes"
	"net/http"
	"unsafe"
)

// Request is a guest's lookup request, relative to an endpoint: docs/abi.md, "Lookup request
// format". Build one with [ParseRequest] from guest bytes, or directly from Go.
type Request struct {
	Method string        // GET, HEAD, POST, PUT, PATCH or DELETE
	Path   string        // starts with "/", may carry "?query"; resolved under the endpoint
	Header []HeaderField // in order; duplicates allowed
	Body   []byte
}

// HeaderField is one request header as the guest wrote it.
type HeaderField struct {
	Name, Value string
}

// Limits of the request format, beyond the host's overall request size limit (1 MiB by
// default, enforced by the caller before parsing).
const (
	maxHeaders    = 64
	maxRequestURI = 8 << 10
)

// Methods are interned so that parsing allocates no string for them.
var methods = [...]string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

func internMethod(b []byte) (string, bool) {
	for _, m := range methods {
		if string(b) == m { // no allocation: compiler-recognised comparison
			return m, true
		}
	}
	return "", false
}

// idempotent reports whether m is idempotent per RFC 9110 §9.2.2: a retry cannot change the
// outcome even if the first attempt was processed.
func idempotent(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodPut || m == http.MethodDelete
}

// safe reports whether m is a safe method (RFC 9110 §9.2.1): read-only, so responses may be
// cached and identical calls shared.
func safe(m string) bool { return m == http.MethodGet || m == http.MethodHead }

// ParseRequest parses the ABI's text-framed request:
//
//	METHOD SP PATH LF
//	*( NAME ":" SP VALUE LF )
//	LF
//	BODY
//
// Parsing is strict: one space after the method, a known method, a path that starts with "/"
// and holds only visible ASCII, header names that are RFC 9110 tokens, exactly ": " after a
// name, no CR or other control bytes in values, at most 64 headers. The final LF of the
// request line or of the last header, and the blank line, may be omitted when the body is
// empty. Policy (which methods, headers and paths an endpoint accepts) is checked later, by
// the endpoint. Errors are *Error of KindRefused.
//
// The result does not alias b: the head is copied into one string that Path and the header
// fields slice, and the body into one new slice, so b may be reused at once.
func ParseRequest(b []byte) (Request, error) { return parseRequest(b, false) }

// parseRequest is ParseRequest; with alias set, the result's strings and body view b instead
// of copies, for a caller that owns b and never writes it again (DoRaw's copy).
func parseRequest(b []byte, alias bool) (Request, error) {
	var r Request
	line, rest, _ := cutLF(b)
	sp := bytes.IndexByte(line, ' ')
	if sp < 0 {
		return r, refused(RuleRequestFormat, "malformed request line")
	}
	m, ok := internMethod(line[:sp])
	if !ok {
		return r, refused(RuleRequestFormat, "unknown method")
	}
	path := line[sp+1:]
	if len(path) == 0 || path[0] != '/' {
		return r, refused(RuleRequestFormat, "path must start with /")
	}
	if len(path) > maxRequestURI {
		return r, refused(RuleRequestFormat, "path too long")
	}
	for _, c := range path {
		if c <= ' ' || c >= 0x7f || c == '#' {
			return r, refused(RuleRequestFormat, "invalid byte in path")
		}
	}

	// First pass: validate headers and find where the body starts, so that the head can be
	// copied with one allocation.
	headStart := len(b) - len(rest) // offset of the first header line
	nh := 0
	bodyAt := len(b)
	for len(rest) > 0 {
		var hl []byte
		var hadLF bool
		hl, rest, hadLF = cutLF(rest)
		if len(hl) == 0 {
			if hadLF {
				bodyAt = len(b) - len(rest)
			}
			break
		}
		if err := checkHeaderLine(hl); err != nil {
			return r, err
		}
		nh++
		if nh > maxHeaders {
			return r, refused(RuleRequestFormat, "too many headers")
		}
	}

	var all string // the head, copied once (or viewed, with alias)
	if alias {
		all = unsafe.String(unsafe.SliceData(b), bodyAt)
	} else {
		all = string(b[:headStart])
	}
	r.Method = m
	r.Path = all[sp+1 : sp+1+len(path)]
	if nh > 0 {
		var hs string
		if alias {
			hs = all[headStart:bodyAt]
		} else {
			hs = string(b[headStart:bodyAt])
		}
		r.Header = make([]HeaderField, 0, nh)
		for len(hs) > 0 {
			i := indexLF(hs)
			var hl string
			if i < 0 {
				hl, hs = hs, ""
			} else {
				hl, hs = hs[:i], hs[i+1:]
			}
			if hl == "" {
				break
			}
			c := indexColon(hl)
			r.Header = append(r.Header, HeaderField{Name: hl[:c], Value: hl[c+2:]})
		}
	}
	if bodyAt < len(b) {
		if alias {
			r.Body = b[bodyAt:len(b):len(b)]
		} else {
			r.Body = bytes.Clone(b[bodyAt:])
		}
	}
	return r, nil
}

func cutLF(b []byte) (line, rest []byte, hadLF bool) {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		return b[:i], b[i+1:], true
	}
	return b, nil, false
}

func indexLF(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			return i
		}
	}
	return -1
}

func indexColon(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			return i
		}
	}
	return -1
}

// checkHeaderLine validates `NAME ": " VALUE`.
func checkHeaderLine(l []byte) error {
	c := bytes.IndexByte(l, ':')
	if c <= 0 {
		return refused(RuleRequestFormat, "malformed header")
	}
	for _, ch := range l[:c] {
		if !isTokenChar(ch) {
			return refused(RuleRequestFormat, "invalid header name")
		}
	}
	if c+1 >= len(l) || l[c+1] != ' ' {
		return refused(RuleRequestFormat, `header name must be followed by ": "`)
	}
	for _, ch := range l[c+2:] {
		// VCHAR, SP, HTAB and obs-text; no CR, NUL or other controls (RFC 9110 §5.5).
		if (ch < ' ' && ch != '\t') || ch == 0x7f {
			return refused(RuleRequestFormat, "invalid byte in header value")
		}
	}
	return nil
}

// isTokenChar reports whether c is an RFC 9110 tchar.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// AppendTo appends r in the ABI request format to b. ParseRequest(r.AppendTo(nil)) yields r
// back for any request ParseRequest accepted.
func (r Request) AppendTo(b []byte) []byte {
	b = append(b, r.Method...)
	b = append(b, ' ')
	b = append(b, r.Path...)
	b = append(b, '\n')
	for _, h := range r.Header {
		b = append(b, h.Name...)
		b = append(b, ": "...)
		b = append(b, h.Value...)
		b = append(b, '\n')
	}
	b = append(b, '\n')
	return append(b, r.Body...)
}
