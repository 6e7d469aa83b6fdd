package lookup

import (
	"os"

	"golang.org/x/sys/unix"
)

// wakeTimer is h2Server's writer clock on Linux: a timerfd, read through the netpoller. An
// idle Go runtime sleeps in epoll_wait, whose timeout is in whole milliseconds, so a
// time.Timer fires up to 1 ms late; a timerfd is a file that the same epoll_wait watches,
// and the kernel wakes it on time.
type wakeTimer struct{ f *os.File }

func newWakeTimer() *wakeTimer {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		panic(err)
	}
	return &wakeTimer{f: os.NewFile(uintptr(fd), "timerfd")} // non-blocking: pollable
}

// arm makes wait return at mono (CLOCK_MONOTONIC ns), replacing any earlier arming.
func (t *wakeTimer) arm(mono int64) {
	ts := unix.NsecToTimespec(mono)
	unix.TimerfdSettime(int(t.f.Fd()), unix.TFD_TIMER_ABSTIME, &unix.ItimerSpec{Value: ts}, nil)
}

// wait blocks until the timer fires; after close it returns an error.
func (t *wakeTimer) wait() error {
	var tick [8]byte
	_, err := t.f.Read(tick[:])
	return err
}

func (t *wakeTimer) Close() error { return t.f.Close() }

func monotonicNow() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}
