// Package attempt is what host/lookup and its transports (internal/h1, internal/h2) share
// about one exchange in flight: its deadline, its cancellation, whether a byte of the
// request may have left, and when the request was sent and answered.
//
// An [Attempt] belongs to one exchange at a time. The endpoint resets it, hands it to a
// transport with the request, and may cancel it from any goroutine; the transport publishes
// what Cancel must interrupt (the connection it writes to, a dial, its own stream) for the
// time it owns it, and takes it back under the attempt's lock, so that a Cancel that arrives
// after the exchange ended touches nothing another exchange owns.
package attempt

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// ErrBodyTooLarge is the error of a response body over the transport's MaxBodyBytes.
var ErrBodyTooLarge = errors.New("response body too large")

// Deadliner is a connection whose blocked reads and writes SetDeadline interrupts (a
// net.Conn).
type Deadliner interface {
	SetDeadline(time.Time) error
}

// Canceler is an exchange of a transport that cancels through a call back (internal/h2's
// stream): see Bind.
type Canceler interface {
	// CancelAttempt aborts the exchange. It is called by Attempt.Cancel after the attempt's
	// lock is released, possibly with the caller's locks held: it must not call the
	// exchange's completion before returning.
	CancelAttempt()
}

// Attempt carries the deadline and the cancellation of one exchange at a time. The zero
// value has no deadline; Reset prepares it for the next exchange. Its methods are safe for
// concurrent use with the exchange.
type Attempt struct {
	// Deadline bounds the exchange, response body included. Zero: none.
	Deadline time.Time
	// Context, if set, also bounds dialling (a new connection); it is not watched otherwise.
	Context context.Context

	// RequestContext and StopWatch belong to a transport that runs an exchange under a
	// request's context (h1's RoundTrip): errors report the context's error once it ended,
	// and StopWatch, if set, is called when the exchange ends.
	RequestContext context.Context
	StopWatch      func() bool

	mu         sync.Mutex
	cancelled  bool               // guarded by mu
	conn       Deadliner          // the connection the exchange owns (Own); guarded by mu
	dialCancel context.CancelFunc // ends a dial in progress; guarded by mu
	onCancel   Canceler           // another transport's exchange (Bind); guarded by mu
	wrote      atomic.Bool

	// Unix nanoseconds; atomic because net/http reports them from goroutines of its own.
	sent, answered atomic.Int64
}

// aLongTimeAgo is a deadline in the past: it wakes every blocked read and write at once.
var aLongTimeAgo = time.Unix(1, 0)

// Reset prepares a for a new exchange with the given deadline. It must not be called while
// an exchange still uses a.
func (a *Attempt) Reset(deadline time.Time) {
	a.mu.Lock()
	a.conn, a.cancelled, a.dialCancel, a.onCancel = nil, false, nil, nil
	a.mu.Unlock()
	a.wrote.Store(false)
	a.sent.Store(0)
	a.answered.Store(0)
	a.Deadline = deadline
}

// Cancel aborts the exchange: a blocked read, write or dial returns at once, the exchange
// fails with an error that wraps context.Canceled, and its connection is closed. Cancelling
// an attempt whose exchange has ended does nothing to any connection.
func (a *Attempt) Cancel() {
	a.mu.Lock()
	a.cancelled = true
	if a.conn != nil {
		a.conn.SetDeadline(aLongTimeAgo) // under the lock: Disown cannot pass it meanwhile
	}
	if a.dialCancel != nil {
		a.dialCancel()
	}
	onCancel := a.onCancel
	a.onCancel = nil
	a.mu.Unlock()
	if onCancel != nil {
		onCancel.CancelAttempt()
	}
}

// Cancelled reports whether Cancel was called since the last Reset.
func (a *Attempt) Cancelled() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cancelled
}

// Own publishes the connection the exchange now writes to and reads from, so that Cancel
// interrupts it. It reports false, and publishes nothing, if a is cancelled already.
func (a *Attempt) Own(c Deadliner) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cancelled {
		return false
	}
	a.conn = c
	return true
}

// Extend sets c's deadline to a's (a transport that keeps a connection's earlier deadline
// across exchanges moves it so when it passes): under a's lock, so that it cannot undo a
// Cancel. It reports false, and sets nothing, if a is cancelled.
func (a *Attempt) Extend(c Deadliner) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cancelled {
		return false
	}
	c.SetDeadline(a.Deadline)
	return true
}

// Disown ends the exchange's use of its connection (before the connection goes back to a
// pool): Cancel no longer touches it. It reports whether a was cancelled, and calls
// StopWatch once.
func (a *Attempt) Disown() (cancelled bool) {
	a.mu.Lock()
	a.conn = nil
	cancelled = a.cancelled
	a.mu.Unlock()
	if a.StopWatch != nil {
		a.StopWatch()
		a.StopWatch = nil
	}
	return cancelled
}

// Dialling publishes cancel, which ends the dial in progress, until the returned function is
// called. It reports false, and publishes nothing, if a is cancelled already.
func (a *Attempt) Dialling(cancel context.CancelFunc) (done func(), ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cancelled {
		return nil, false
	}
	a.dialCancel = cancel
	return func() {
		a.mu.Lock()
		a.dialCancel = nil
		a.mu.Unlock()
	}, true
}

// Bind lets a transport that cancels through a call back (internal/h2) run an exchange
// under a: Cancel calls cancel.CancelAttempt, once, until Unbind. It reports false, and
// binds nothing, if a is cancelled already.
func (a *Attempt) Bind(cancel Canceler) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cancelled {
		return false
	}
	a.onCancel = cancel
	return true
}

// Unbind ends what Bind started: Cancel no longer calls the transport back.
func (a *Attempt) Unbind() {
	a.mu.Lock()
	a.onCancel = nil
	a.mu.Unlock()
}

// MarkWrote records that bytes of the request may have reached the network (just before
// the first write).
func (a *Attempt) MarkWrote() { a.wrote.Store(true) }

// Wrote reports whether any byte of the request may have reached the network.
func (a *Attempt) Wrote() bool { return a.wrote.Load() }

// MarkSent records when the whole request had been handed to the network (its last write
// returned; for internal/h2, whose writes carry many streams' frames, when a write took its
// HEADERS), and MarkAnswered when the response's head had arrived (for internal/h2, when
// the read that brought it returned); both are read after the exchange ended.
func (a *Attempt) MarkSent(t time.Time) { a.sent.Store(t.UnixNano()) }

// MarkAnswered: see MarkSent.
func (a *Attempt) MarkAnswered(t time.Time) { a.answered.Store(t.UnixNano()) }

// Upstream returns the time from the request's last write to the response's head: the
// upstream's share of the exchange, without the client's own queueing before the write
// (a slot, a goroutine, a dial) or after the head (the body, the completion). ok is false if
// the transport did not record both.
func (a *Attempt) Upstream() (d time.Duration, ok bool) {
	s, r := a.sent.Load(), a.answered.Load()
	if s == 0 || r == 0 || r < s {
		return 0, false
	}
	return time.Duration(r - s), true
}
