package lookup

import (
	"context"
	"sync"
)

// watches ends waiters whose context ends, with one context.AfterFunc per context instead
// of one per waiter: a caller such as the scheduler sends every lookup of a run under one
// context, and an AfterFunc per lookup (two allocations, and an insertion into and a
// deletion from the context's set of children under its lock) was a few per cent of the
// client's CPU per lookup. Waiters are grouped by their context's Done channel, which is
// comparable whatever the context's type is, and each group holds one AfterFunc while it
// has a waiter.
type watches struct {
	mu     sync.Mutex
	groups map[<-chan struct{}]*watchGroup // guarded by mu
}

// watchGroup is the waiters of one Done channel, linked through waiter.wprev/wnext. ctx is
// the first waiter's context: contexts that share a Done channel end together, with the
// same error.
type watchGroup struct {
	done <-chan struct{}
	ctx  context.Context
	stop func() bool
	head *waiter
	n    int
}

// watch makes c.leave(w, …) run when ctx ends, until unwatch(w). A context that cannot end
// is not watched. It must happen before w can be delivered (and so before unwatch).
func (ws *watches) watch(ctx context.Context, c *call, w *waiter) {
	done := ctx.Done()
	if done == nil {
		return
	}
	w.c = c
	ws.mu.Lock()
	g := ws.groups[done]
	if g == nil {
		if ws.groups == nil {
			ws.groups = make(map[<-chan struct{}]*watchGroup)
		}
		g = &watchGroup{done: done, ctx: ctx}
		ws.groups[done] = g
		// Under ws.mu: an AfterFunc that runs at once (ctx ended already) waits in ended
		// until g is complete.
		g.stop = context.AfterFunc(ctx, func() { ws.ended(g) })
	}
	w.group = g
	w.wnext = g.head
	if g.head != nil {
		g.head.wprev = w
	}
	g.head = w
	g.n++
	ws.mu.Unlock()
}

// unwatch ends w's watch (it was delivered). The last waiter of a group stops its AfterFunc.
func (ws *watches) unwatch(w *waiter) {
	if w.c == nil {
		return // never watched
	}
	ws.mu.Lock()
	if g := w.group; g != nil { // nil: its context ended, and ended took it
		ws.unlinkLocked(g, w)
		if g.n == 0 {
			delete(ws.groups, g.done)
			g.stop()
		}
	}
	ws.mu.Unlock()
}

func (ws *watches) unlinkLocked(g *watchGroup, w *waiter) {
	if w.wprev != nil {
		w.wprev.wnext = w.wnext
	} else {
		g.head = w.wnext
	}
	if w.wnext != nil {
		w.wnext.wprev = w.wprev
	}
	w.wprev, w.wnext, w.group = nil, nil, nil
	g.n--
}

// ended runs when g's context ended: every waiter still in g leaves its call.
func (ws *watches) ended(g *watchGroup) {
	ws.mu.Lock()
	if ws.groups[g.done] == g {
		delete(ws.groups, g.done)
	}
	var gone []*waiter
	for w := g.head; w != nil; w = g.head {
		ws.unlinkLocked(g, w)
		gone = append(gone, w)
	}
	ws.mu.Unlock()
	err := g.ctx.Err()
	for _, w := range gone {
		w.c.leave(w, err)
	}
}
