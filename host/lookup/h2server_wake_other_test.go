//go:build !linux

package lookup

import (
	"errors"
	"sync"
	"time"
)

// wakeTimer is h2Server's writer clock where there is no timerfd: a time.Timer (which an
// idle runtime may fire up to 1 ms late; see the Linux version).
type wakeTimer struct {
	mu     sync.Mutex
	t      *time.Timer
	c      chan struct{}
	closed chan struct{}
	once   sync.Once
}

var monoBase = time.Now()

func monotonicNow() int64 { return int64(time.Since(monoBase)) }

func newWakeTimer() *wakeTimer {
	return &wakeTimer{c: make(chan struct{}, 1), closed: make(chan struct{})}
}

func (t *wakeTimer) arm(mono int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fire := func() {
		select {
		case t.c <- struct{}{}:
		default:
		}
	}
	if t.t != nil {
		t.t.Stop()
	}
	t.t = time.AfterFunc(time.Duration(mono-monotonicNow()), fire)
}

func (t *wakeTimer) wait() error {
	select {
	case <-t.c:
		return nil
	case <-t.closed:
		return errors.New("closed")
	}
}

func (t *wakeTimer) Close() error {
	t.once.Do(func() { close(t.closed) })
	return nil
}
