package h2

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/attempt"
	"golang.org/x/net/http2"
)

// stream is one exchange.
type stream struct {
	req      *http.Request
	body     []byte // request body still to send (a suffix of the original)
	a        *attempt.Attempt
	done     func(*http.Response, error)
	deadline time.Time
	hidx     int // index in the connection's deadline heap; -1 when not in it

	c       atomic.Pointer[conn]  // the connection st is assigned to; nil while it moves
	aborted atomic.Pointer[error] // an abort that came while st moved between connections

	// Guarded by the connection's mutex.
	id       uint32 // 0 until sent
	ended    bool   // done has been or is being called
	sendWin  int64  // the peer's window for this stream
	recvUsed int64  // bytes received since the last stream WINDOW_UPDATE

	// Owned by the reader goroutine.
	resp    *http.Response
	rbody   []byte
	gotHead bool
}

// abort ends st with err if it has not ended: the stream is reset if it was sent.
func (st *stream) abort(err error) {
	c := st.c.Load()
	if c == nil {
		st.aborted.Store(&err) // moving after a GOAWAY: requeue fails it
		if c = st.c.Load(); c == nil {
			return
		}
	}
	c.mu.Lock()
	for c2 := st.c.Load(); c2 != c; c2 = st.c.Load() { // moved by a GOAWAY: follow it
		c.mu.Unlock()
		if c = c2; c == nil {
			return // requeue sees st.aborted
		}
		c.mu.Lock()
	}
	if st.ended {
		c.mu.Unlock()
		return
	}
	if st.id != 0 && c.err == nil {
		c.fr.WriteRSTStream(st.id, http2.ErrCodeCancel)
	}
	c.endLocked(st)
	c.unlock()
	st.finish(nil, err)
}

// CancelAttempt implements attempt.Canceler: Cancel may be called with the caller's locks held
// (host/lookup's call.stop), so abort, which calls done, runs on its own goroutine.
func (st *stream) CancelAttempt() {
	go st.abort(&connError{op: "exchange", err: context.Canceled})
}

// finish calls done (no lock held).
func (st *stream) finish(resp *http.Response, err error) {
	st.a.Unbind()
	if err != nil && errors.Is(err, errTimeout) {
		err = &connError{op: "exchange", err: context.DeadlineExceeded}
	}
	st.done(resp, err)
}

// body is a response body read in full; Bytes lets host/lookup take it without a copy.
type body struct {
	b   []byte
	off int
}

func (b *body) Read(p []byte) (int, error) {
	if b.off >= len(b.b) {
		return 0, io.EOF
	}
	n := copy(p, b.b[b.off:])
	b.off += n
	return n, nil
}

func (b *body) Close() error { return nil }

func (b *body) Bytes() []byte { return b.b }

// Deadlines: each connection keeps its streams with a deadline in a min-heap and one timer
// for the earliest, instead of a timer per stream.

// The deadline heap's view of a stream.
func (st *stream) Before(o *stream) bool { return st.deadline.Before(o.deadline) }

func (st *stream) SetIndex(i int) { st.hidx = i }

func (st *stream) Index() int { return st.hidx }

// watchLocked adds st to c's deadlines and arms the timer if st is the earliest.
func (c *conn) watchLocked(st *stream) {
	c.deadlines.Push(st)
	if c.armed.IsZero() || st.deadline.Before(c.armed) {
		c.armLocked(st.deadline)
	}
}

func (c *conn) unwatchLocked(st *stream) {
	c.deadlines.Remove(st)
	// The timer stays armed: when it fires early it re-arms for the new earliest.
}

func (c *conn) armLocked(at time.Time) {
	c.armed = at
	d := time.Until(at)
	if c.dtimer == nil {
		c.dtimer = time.AfterFunc(d, c.expire)
	} else {
		c.dtimer.Reset(d)
	}
}

// expire aborts the streams whose deadline has passed and re-arms for the next.
func (c *conn) expire() {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	now := time.Now()
	var due []*stream
	for c.deadlines.Len() > 0 && !c.deadlines.Min().deadline.After(now) {
		due = append(due, c.deadlines.Pop())
	}
	c.armed = time.Time{}
	if c.deadlines.Len() > 0 {
		c.armLocked(c.deadlines.Min().deadline)
	}
	c.unlock()
	for _, st := range due {
		st.abort(&connError{op: "exchange", err: errTimeout})
	}
}

// statusLines holds "200 OK" and the like, so that a response does not build its status.
var statusLines = func() (l [600]string) {
	for i := 200; i < len(l); i++ {
		if t := http.StatusText(i); t != "" {
			l[i] = strconv.Itoa(i) + " " + t
		}
	}
	return l
}()

func statusLine(code int) string {
	if code < len(statusLines) && statusLines[code] != "" {
		return statusLines[code]
	}
	return strconv.Itoa(code)
}
