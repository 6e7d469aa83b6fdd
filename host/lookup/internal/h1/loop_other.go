//go:build !linux

package h1

import (
	"context"
	"net"
	"net/http"
	"time"
)

// LoopAvailable reports whether Loop works on this platform.
const LoopAvailable = false

// Loop is the event-loop client (Linux only); elsewhere every exchange fails with
// ErrUnsupported.
type Loop struct {
	Dial                   func(ctx context.Context, network, addr string) (net.Conn, error)
	Context                context.Context
	MaxIdleConnsPerHost    int
	IdleConnTimeout        time.Duration
	MaxResponseHeaderBytes int
	MaxHeaderCount         int
	MaxBodyBytes           int64
	Spin                   time.Duration
}

type loopExch struct{ l *Loop }

func (l *Loop) cancel(*loopExch) {}

// Handles reports whether Start serves req: never here.
func (l *Loop) Handles(*http.Request) bool { return false }

// Start fails with ErrUnsupported.
func (l *Loop) Start(req *http.Request, a *Attempt, done func(*http.Response, error)) {
	closeBody(req)
	go done(nil, ErrUnsupported)
}

// Close does nothing.
func (l *Loop) Close() {}
