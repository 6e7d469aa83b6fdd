package lookup

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/attempt"
	"github.com/clink-wasm/clink-wasm/host/lookup/internal/h1"
)

// transport is the one seam between an endpoint and its HTTP clients: h1 (internal/h1),
// h2c (internal/h2) and net/http. Every attempt goes through it the same way: the deadline,
// the cancellation, "may a byte have left" and the sent/answered marks all live in the
// attempt (internal/attempt), so the endpoint has one cancel path and one classification.
type transport interface {
	// Handles reports whether the transport takes req; the endpoint's net/http transport
	// takes the rest, decided before anything is sent.
	Handles(req *http.Request) bool
	// Start runs one exchange under a and calls done exactly once. The response body reads
	// within a's deadline; a.Cancel aborts the exchange, body included.
	Start(req *http.Request, a *attempt.Attempt, done func(*http.Response, error))
	// Blocking reports whether Start runs the exchange on the calling goroutine (and calls
	// done before it returns); otherwise done runs on a goroutine of the transport's, which
	// must not block.
	Blocking() bool
	// Close aborts every exchange on the wire and closes the connections.
	Close()
}

// exchanger is a blocking transport that also returns an exchange's outcome instead of
// calling back (h1): the endpoint's blocking path uses it, which saves a callback per call.
// Exchange is Start without done.
type exchanger interface {
	Exchange(req *http.Request, a *attempt.Attempt) (*http.Response, error)
}

var _ exchanger = h1Transport{}

// h1Transport is internal/h1 behind the seam: Start is a blocking Exchange.
type h1Transport struct{ *h1.Transport }

func (t h1Transport) Start(req *http.Request, a *attempt.Attempt, done func(*http.Response, error)) {
	done(t.Exchange(req, a))
}

func (h1Transport) Blocking() bool { return true }

// stdTransport is net/http's Transport behind the seam: the attempt's deadline and Cancel
// become a context's, and httptrace reports the writes and the response's first byte.
type stdTransport struct {
	rt  *http.Transport
	ctx context.Context // the endpoint's: Close cancels every exchange
}

func (stdTransport) Handles(*http.Request) bool { return true }
func (stdTransport) Blocking() bool             { return true }
func (t stdTransport) Close()                   { t.rt.CloseIdleConnections() }

// cancelFunc lets Attempt.Cancel cancel a context.
type cancelFunc context.CancelFunc

func (f cancelFunc) CancelAttempt() { f() }

func (t stdTransport) Start(req *http.Request, a *attempt.Attempt, done func(*http.Response, error)) {
	ctx, cancel := context.WithDeadline(t.ctx, a.Deadline)
	if !a.Bind(cancelFunc(cancel)) {
		cancel()
		if req.Body != nil {
			req.Body.Close()
		}
		done(nil, context.Canceled)
		return
	}
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaderField:     func(string, []string) { a.MarkWrote() },
		WroteHeaders:         func() { a.MarkWrote() },
		WroteRequest:         func(httptrace.WroteRequestInfo) { a.MarkSent(time.Now()) },
		GotFirstResponseByte: func() { a.MarkAnswered(time.Now()) },
	})
	resp, err := t.rt.RoundTrip(req.WithContext(ctx))
	if err != nil {
		a.Unbind()
		cancel()
		done(nil, err)
		return
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, a: a, cancel: cancel}
	done(resp, nil)
}

// cancelBody ends a net/http exchange's context when its body is closed.
type cancelBody struct {
	io.ReadCloser
	a      *attempt.Attempt
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.a.Unbind()
	b.cancel()
	return err
}
