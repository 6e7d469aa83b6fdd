package clink

import (
	"strings"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"
)

// Endpoint is a named HTTP lookup endpoint. The pipeline that runs the module defines it (base
// URL, secrets, timeouts, retries, rate and size limits); the module only names it and requests
// paths below it. Declare endpoints as package-level variables:
//
//	var geo = clink.NewEndpoint("geo")
type Endpoint struct {
	name  string
	index uint32
}

// NewEndpoint declares an endpoint (1-128 characters of [A-Za-z0-9_.-], unique, at most 64 per
// module). It panics on an invalid or duplicate name, or when called after initialisation.
func NewEndpoint(name string) *Endpoint {
	return &Endpoint{name: name, index: uint32(declare("Endpoint", &endpointNames, name, 64))}
}

// Name returns the endpoint's name.
func (e *Endpoint) Name() string { return e.name }

// Header is one request header.
type Header struct {
	Name, Value string
}

var request []byte

// Lookup sends an HTTP request through the endpoint and waits for the response. method is
// GET, HEAD, POST, PUT, PATCH or DELETE (and one the endpoint allows); path starts with "/",
// may carry a query, and must stay under the endpoint's path prefix. headers may be nil; the
// endpoint's own (secret) headers are added by the host and cannot be overridden.
//
// A response, whatever its status, is returned as (status, body, nil): a non-2xx status is for
// the operator to interpret. body is a view of the SDK's result buffer, valid until the next Get
// or Lookup. A request that could not be completed returns an *Error: errors.Is it against
// ErrLookupTimeout, ErrLookupBreakerOpen, ErrLookupResponseTooLarge, ErrLookupRefused,
// ErrLookupUnavailable or ErrLookupCancelled, and ask Retryable whether to try again later. A
// method, path or header containing a line break is refused here, as ErrLookupRefused, before
// anything is sent.
//
// Lookup may suspend while the host waits for the response (including its retries); the
// operator does not see it.
func (e *Endpoint) Lookup(method, path string, headers []Header, body []byte) (status int, respBody []byte, err error) {
	op := "lookup " + e.name
	if !safeLine(method) || !safeLine(path) {
		return 0, nil, &Error{Op: op, Code: CodeLookupRefused}
	}
	r := append(request[:0], method...)
	r = append(r, ' ')
	r = append(r, path...)
	r = append(r, '\n')
	for _, h := range headers {
		if h.Name == "" || !safeLine(h.Name) || strings.IndexByte(h.Name, ':') >= 0 || !safeLine(h.Value) {
			return 0, nil, &Error{Op: op, Code: CodeLookupRefused}
		}
		r = append(r, h.Name...)
		r = append(r, ": "...)
		r = append(r, h.Value...)
		r = append(r, '\n')
	}
	if len(body) > 0 {
		r = append(r, '\n')
		r = append(r, body...)
	}
	request = r

	p, c := abi.Spare(result[:0])
	packed := abi.Lookup(e.index, abi.Ptr(r), uint32(len(r)), p, c)
	if cap(request) > 1<<20 {
		request = nil // do not pin a huge request buffer
	}
	if packed < 0 {
		return 0, nil, codeErr(op, packed)
	}
	status, n := int(packed>>32), int(uint32(packed))
	if uint32(n) <= c {
		return status, result[:n], nil
	}
	v, err := fetch(op, result[:0], n)
	result = v[:0]
	if err != nil {
		return 0, nil, err
	}
	return status, v, nil
}

func safeLine(s string) bool { return strings.IndexByte(s, '\n') < 0 && strings.IndexByte(s, '\r') < 0 }
