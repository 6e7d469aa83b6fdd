package lookup

import (
	"errors"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"unsafe"
)

// prepare applies the endpoint's policy to req and builds the call.
func (e *Endpoint) prepare(req Request) (*call, *Error) {
	mi := methodIndex(req.Method)
	if mi < 0 || !e.allowed[mi] {
		return nil, refused(RuleMethods, "method "+req.Method+" not allowed")
	}
	escaped, query, err := resolvePath(e.root, e.prefix, req.Path)
	if err != nil {
		var le *Error
		errors.As(err, &le)
		return nil, le
	}
	c := &call{e: e, method: req.Method, body: req.Body, idempotent: idempotent(req.Method)}
	c.url = *e.base
	c.url.RawPath = escaped
	c.url.Path = escaped
	if strings.IndexByte(escaped, '%') >= 0 {
		c.url.Path, _ = url.PathUnescape(escaped) // validated by resolvePath
	}
	c.url.RawQuery = query
	if len(req.Header) == 0 {
		c.header = e.inject // shared and read-only: net/http does not modify request headers
	} else {
		c.header = make(http.Header, len(req.Header)+len(e.inject))
		for k, v := range e.inject {
			c.header[k] = v
		}
		for _, h := range req.Header {
			if !validHeader(h) {
				return nil, refused(RuleHeaders, "malformed header")
			}
			k := textproto.CanonicalMIMEHeaderKey(h.Name)
			if forbiddenHeaders[k] || e.injected[k] {
				return nil, refused(RuleHeaders, "header "+k+" may not be set")
			}
			c.header[k] = append(c.header[k], h.Value)
		}
	}
	c.shared = e.sfAll || (e.sfSafe && safe(req.Method))
	c.cacheable = e.cache != nil && e.cache.cacheable(req.Method)
	if c.shared || c.cacheable {
		c.key = requestKey(req, escaped, query)
	}
	return c, nil
}

// validHeader re-checks a header of a Request built from Go rather than ParseRequest.
func validHeader(h HeaderField) bool {
	if h.Name == "" {
		return false
	}
	for i := 0; i < len(h.Name); i++ {
		if !isTokenChar(h.Name[i]) {
			return false
		}
	}
	for i := 0; i < len(h.Value); i++ {
		if c := h.Value[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// requestKey identifies a request for single-flight and the cache: the normalised path, so
// that "/a/../b" and "/b" share, plus method, guest headers in order, and body. It is built
// in one buffer, never written again, which the string views.
func requestKey(req Request, escaped, query string) string {
	n := len(req.Method) + len(escaped) + len(query) + len(req.Body) + 4
	for _, h := range req.Header {
		n += len(h.Name) + len(h.Value) + 2
	}
	b := make([]byte, 0, n)
	b = append(b, req.Method...)
	b = append(b, ' ')
	b = append(b, escaped...)
	b = append(b, '?')
	b = append(b, query...)
	b = append(b, '\n')
	for _, h := range req.Header {
		for i := 0; i < len(h.Name); i++ { // ASCII: a token
			c := h.Name[i]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			b = append(b, c)
		}
		b = append(b, ':')
		b = append(b, h.Value...)
		b = append(b, '\n')
	}
	b = append(b, '\n')
	b = append(b, req.Body...)
	return unsafe.String(unsafe.SliceData(b), len(b))
}
