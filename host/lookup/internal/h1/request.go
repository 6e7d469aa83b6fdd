package h1

import (
	"errors"
	"net/http"
	"strconv"
)

const defaultUserAgent = "Go-http-client/1.1" // what net/http sends, so upstreams see no difference

// excluded request headers: written from the request's fields, or never.
func excluded(k string) bool {
	switch k {
	case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
		return true
	}
	return false
}

// appendRequestHead appends the request line and header fields of req to b. Names, values,
// the method, the target and the host are validated: nothing the caller passes can split the
// request or inject a field.
func appendRequestHead(b []byte, req *http.Request) ([]byte, error) {
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	if !isToken(method) {
		return b, errors.New("h1: invalid method " + strconv.Quote(method))
	}
	target := req.URL.RequestURI()
	if !validTarget(target) {
		return b, errors.New("h1: invalid request target")
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if !validHost(host) {
		return b, errors.New("h1: invalid Host " + strconv.Quote(host))
	}
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, target...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\n"...)

	ua := defaultUserAgent
	if v, ok := req.Header["User-Agent"]; ok {
		ua = ""
		if len(v) > 0 {
			ua = v[0]
		}
	}
	if ua != "" {
		if !validValue(ua) {
			return b, errors.New("h1: invalid User-Agent")
		}
		b = append(b, "User-Agent: "...)
		b = append(b, ua...)
		b = append(b, "\r\n"...)
	}

	// Fields in sorted order, as net/http writes them: deterministic bytes on the wire.
	var keysArr [32]string
	keys := keysArr[:0]
	for k := range req.Header {
		if !excluded(k) {
			keys = append(keys, k)
		}
	}
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	for _, k := range keys {
		if !isToken(k) {
			return b, errors.New("h1: invalid header name " + strconv.Quote(k))
		}
		for _, v := range req.Header[k] {
			if !validValue(v) {
				return b, errors.New("h1: invalid value for header " + k)
			}
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, trimOWS(v)...)
			b = append(b, "\r\n"...)
		}
	}
	if req.Close {
		if _, ok := req.Header["Connection"]; !ok {
			b = append(b, "Connection: close\r\n"...)
		}
	}
	hasBody := req.Body != nil && req.Body != http.NoBody
	switch {
	case hasBody:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, req.ContentLength, 10)
		b = append(b, "\r\n"...)
	case method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch:
		b = append(b, "Content-Length: 0\r\n"...) // as net/http: these methods announce an empty body
	}
	return append(b, "\r\n"...), nil
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tchar[s[i]] {
			return false
		}
	}
	return true
}

var tchar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// validValue: field-content bytes (VCHAR, obs-text, SP, HTAB); no CR, LF, NUL or other
// controls.
func validValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// validTarget: an origin-form or asterisk-form target of visible ASCII.
func validTarget(s string) bool {
	if s == "" || (s[0] != '/' && s != "*") {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// validHost: reg-name, IPv4 or bracketed IPv6, optional port; the bytes RFC 3986 allows.
func validHost(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if tchar[c] && c != '|' && c != '^' && c != '`' && c != '#' || c == ':' || c == '[' || c == ']' ||
			c == '(' || c == ')' || c == ',' || c == ';' || c == '=' {
			continue
		}
		return false
	}
	return true
}

func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}
