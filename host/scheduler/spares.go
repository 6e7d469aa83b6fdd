package scheduler

// Spare instances, made off the runner.
//
// A task that finds the pool empty gets a new instance at once (acquireSlot), instantiated on
// the runner: about 50 µs for a small module, during which no record advances. A cold-heavy
// workload ramping up to its in-flight cap needs hundreds of them (every call suspended in a
// read holds one), so the runner spends a large share of its first milliseconds instantiating.
// Therefore, each time the pool runs dry, the runner also asks for a batch of spares: a maker
// goroutine instantiates them one after the other while the runner goes on, and posts each
// through the completions queue, where the runner adds it to the pool. Batches double while
// demand lasts (minSpares up to maxSpares), one batch at a time.
//
// The rules that keep this invisible:
//
//   - Budget: a requested spare reserves the expected instance cost (spareBytes) until it
//     arrives, so instances plus spares never exceed the instance memory budget, and never
//     the in-flight cap's worth of instances.
//   - Runner-only state: a spare's setup (its start function and clink_open) runs on the maker
//     goroutine, but every handler call it can make that touches the controller or the
//     pipeline (log, watermark, lookup) is forwarded to the runner and waited for
//     (slot.onRunner). Everything else is refused by host/abi during setup (state, timers,
//     emit) or reads only immutable configuration.
//   - Lifetime: each requested spare is one outstanding operation, so Run returns (and
//     shutdown closes the pool) only after every spare has arrived; the maker stops
//     instantiating once the run's IO context is cancelled.
//   - Errors: a spare that fails to instantiate is dropped and turns spares off for the run;
//     the next instance is then made on the runner, which reports the failure as before.

import (
	"bytes"
	"errors"
	"log/slog"
)

const (
	minSpares = 4
	maxSpares = 64
)

var errSpareCancelled = errors.New("spare not made: the run is ending")

// spareResult is a spare instance posted by the maker, or why it was not made.
type spareResult struct {
	s        *slot
	err      error
	reserved int64 // the budget the request reserved for it
}

// wantSpares runs on the runner after it made an instance because the pool was empty: it
// requests a batch of spares if none is on the way and the budget and cap allow.
func (c *Controller) wantSpares() {
	if c.cfg.Synchronous || c.cfg.NoSpares || c.noSpares || c.spareOut > 0 || c.nextCost <= 0 || c.err != nil {
		return
	}
	c.spareBatch = min(max(c.spareBatch*2, minSpares), maxSpares)
	n := min(c.spareBatch, c.maxInFlight-c.instances)
	for n > 0 && c.instBytes+c.spareBytes+c.waitBytes+int64(n)*c.nextCost > c.cfg.InstanceMemoryBudget {
		n--
	}
	if n <= 0 {
		return
	}
	cost := c.nextCost
	c.spareOut += n
	c.spareBytes += int64(n) * cost
	c.outstanding += n
	go c.makeSpares(n, cost)
}

// makeSpares is the maker goroutine of one batch: n instances, each posted as it is made.
func (c *Controller) makeSpares(n int, reserved int64) {
	for range n {
		r := spareResult{reserved: reserved, err: errSpareCancelled}
		if c.ioCtx.Err() == nil {
			s := &slot{c: c, setup: true}
			inst, err := c.cfg.Module.Instantiate(c.ctx, s)
			if err == nil {
				s.inst = inst
				r.s = s
			}
			r.err = err
		}
		c.comp.post(completion{spare: &r})
	}
}

// adoptSpare installs a spare on the runner: its reservation becomes an instance in the pool.
func (c *Controller) adoptSpare(r *spareResult) {
	c.spareOut--
	c.spareBytes -= r.reserved
	if r.err != nil {
		if !errors.Is(r.err, errSpareCancelled) && !c.noSpares {
			c.noSpares = true
			c.log.LogAttrs(c.ctx, slog.LevelInfo, "a spare instance failed: instances are made on the runner from now on",
				slog.String("error", r.err.Error()))
		}
		return
	}
	s := r.s
	s.setup = false // the maker is done with s: from here on its handler calls come from calls the runner makes
	s.cost = c.footprint(s)
	c.instBytes += s.cost
	c.instances++
	c.metrics.Spares.Add(1)
	if int64(c.instances) > c.metrics.PeakInstances.Load() {
		c.metrics.PeakInstances.Store(int64(c.instances))
	}
	c.pool = append(c.pool, s)
}

// onRunner runs f on the runner and waits for it: how a spare's setup, on the maker goroutine,
// reaches state that only the runner may touch.
func (s *slot) onRunner(f func()) {
	done := make(chan struct{})
	s.c.comp.post(completion{run: func() { f(); close(done) }})
	<-done
}

// setupLookup sends a lookup made by a spare's setup from the runner, and waits for its answer
// off it, as lookupBlocking does for an instance set up on the runner.
func (s *slot) setupLookup(endpoint uint32, req []byte) (int, []byte, error) {
	ch := make(chan lookupResult, 1)
	req = bytes.Clone(req)
	c := s.c
	s.onRunner(func() {
		c.cfg.Lookup(c.ioCtx, endpoint, req, func(status int, body []byte, err error) {
			ch <- lookupResult{status, body, err}
		})
	})
	r := <-ch
	return r.status, r.body, r.err
}
