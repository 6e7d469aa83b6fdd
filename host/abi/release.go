package abi

import (
	"context"
	"sync"

	"github.com/tetratelabs/wazero/api"
)

// Releasing closed instances
//
// Closing an instance's wazero module is about 15 µs for a small module, three quarters of it
// unmapping its linear memory's reservation (memory_linux.go). A run that holds hundreds of
// instances, as the suspension path does (every suspended call holds one), closes them all
// when it ends, one after the other, before Run can return: 512 of them were 5-10 ms of a
// ~330 ms run (docs/BENCHMARKS.md, issue 11, session 12). Nothing waits for that work: once
// clink_close has run and its output has been delivered, the instance is never called again.
//
// So a closed instance's module is handed to a releaser, which closes it on a goroutine of its
// own while the caller goes on. The memory it still holds is bounded: at most
// maxPendingRelease bytes of linear memory (the modules' current sizes) wait at a time, and a
// module that would exceed it is closed by the caller, as before. Engine.Close waits for the
// releaser before it closes the runtime, so nothing outlives the engine.

// maxPendingRelease is how much linear memory may wait to be released at a time. Pages a guest
// never touched cost nothing, so this bounds the RSS that waits as well.
const maxPendingRelease = 64 << 20

// releaser closes modules off the caller's path; see "Releasing closed instances" above.
type releaser struct {
	mu      sync.Mutex
	idle    sync.Cond // signalled when running goes false
	queue   []pendingRelease
	spare   []pendingRelease // the last batch's array, for the next
	pending uint64           // bytes of linear memory queued or being closed
	running bool             // a goroutine is draining the queue
	closed  bool             // the engine is closing: release inline from now on
}

type pendingRelease struct {
	mod   api.Module
	bytes uint64
}

func newReleaser() *releaser {
	r := &releaser{}
	r.idle.L = &r.mu
	return r
}

// release closes mod, whose linear memory is bytes large, now or soon.
func (r *releaser) release(mod api.Module, bytes uint64) {
	r.mu.Lock()
	if r.closed || r.pending+bytes > maxPendingRelease {
		r.mu.Unlock()
		_ = mod.Close(context.Background())
		return
	}
	r.queue = append(r.queue, pendingRelease{mod, bytes})
	r.pending += bytes
	start := !r.running
	r.running = true
	r.mu.Unlock()
	if start {
		go r.drain()
	}
}

// drain closes queued modules, a batch at a time, until the queue is empty.
func (r *releaser) drain() {
	r.mu.Lock()
	for len(r.queue) > 0 {
		batch := r.queue
		r.queue = r.spare[:0]
		r.mu.Unlock()
		var bytes uint64
		for _, p := range batch {
			_ = p.mod.Close(context.Background())
			bytes += p.bytes
		}
		clear(batch)
		r.mu.Lock()
		r.pending -= bytes
		r.spare = batch[:0]
	}
	r.running = false
	r.idle.Broadcast()
	r.mu.Unlock()
}

// wait blocks until every module released so far is closed.
func (r *releaser) wait() {
	r.mu.Lock()
	for r.running {
		r.idle.Wait()
	}
	r.mu.Unlock()
}

// close makes every later release inline and waits for the queue to drain.
func (r *releaser) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.wait()
}
