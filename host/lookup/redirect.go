package lookup

import (
	"io"
	"net/http"
	"strings"
)

// redirect decides what follows resp, the response to req: (nil, nil) to return resp;
// (next, nil) to send next (resp's body has been drained and closed); (nil, err) to fail
// (resp's body closed). via collects the requests sent so far.
//
// The endpoint follows redirects itself (sendOne, exchanged) as net/http's Client does (the
// same method rewriting and body rules), asking checkRedirect before each: no other origin,
// stay under the prefix, at most MaxRedirects. It replaces http.Client, whose per-request
// copies of the request, URL and header the common case (no redirect) does not need.
func (e *Endpoint) redirect(req *http.Request, resp *http.Response, via *[]*http.Request) (*http.Request, error) {
	method, ok, withBody := redirectBehavior(req, resp)
	if !ok {
		return nil, nil
	}
	loc := resp.Header.Get("Location")
	if loc == "" {
		return nil, nil
	}
	u, err := req.URL.Parse(loc)
	if err != nil {
		resp.Body.Close()
		return nil, &Error{Kind: KindUnavailable, Reason: "bad Location in redirect", Err: err}
	}
	*via = append(*via, req)
	next := (&http.Request{
		Method: method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: req.Header, Host: u.Host, Response: resp,
	}).WithContext(req.Context())
	if withBody && req.GetBody != nil {
		if next.Body, err = req.GetBody(); err != nil {
			resp.Body.Close()
			return nil, err
		}
		next.GetBody, next.ContentLength = req.GetBody, req.ContentLength
	}
	if err := e.checkRedirect(next, *via); err != nil {
		if err == http.ErrUseLastResponse {
			return nil, nil
		}
		resp.Body.Close()
		return nil, err
	}
	// Read a little of the old body, so that its connection can be reused (as http.Client).
	if resp.ContentLength == -1 || resp.ContentLength <= 2<<10 {
		io.CopyN(io.Discard, resp.Body, 2<<10)
	}
	resp.Body.Close()
	return next, nil
}

// redirectBehavior is net/http's: 301, 302 and 303 turn a method other than GET and HEAD
// into a GET without body; 307 and 308 resend the method and body (and are not followed if
// the body cannot be resent).
func redirectBehavior(req *http.Request, resp *http.Response) (method string, follow, withBody bool) {
	switch resp.StatusCode {
	case 301, 302, 303:
		method = req.Method
		if method != http.MethodGet && method != http.MethodHead {
			method = http.MethodGet
		}
		return method, true, false
	case 307, 308:
		if req.GetBody == nil && req.ContentLength != 0 {
			return "", false, false
		}
		return req.Method, true, true
	}
	return "", false, false
}

// checkRedirect refuses redirects that leave the endpoint's origin or prefix, and stops after
// MaxRedirects same-origin ones (the 3xx is then the response).
func (e *Endpoint) checkRedirect(req *http.Request, via []*http.Request) error {
	u := req.URL
	if u.Scheme != e.base.Scheme || u.Host != e.base.Host {
		return refused(RuleRedirect, "redirect to another origin ("+u.Scheme+"://"+u.Host+")")
	}
	if len(via) > e.cfg.MaxRedirects {
		return http.ErrUseLastResponse
	}
	p := u.EscapedPath()
	if !isCleanPath(p) || !strings.HasPrefix(p, e.root) || !underPrefix(p[len(e.root):], e.prefix) {
		return refused(RuleRedirect, "redirect outside the endpoint's prefix")
	}
	return nil
}
