package scheduler

// # Input release
//
// A task's key and value alias its input batch (the Element's Key and Value, and whatever
// memory those point into), and so do the Src.Key of the outputs it made until they reach the
// sink. Without WithInputRelease the controller simply drops its references and the garbage
// collector frees the batch. With it, the controller hands every input batch back to the
// caller once it holds nothing that aliases it, so the caller can reuse the batch and its
// bytes instead of allocating new ones for every batch (host/pipeline does: its sources'
// batches were most of a pipeline's allocation).
//
// INVARIANT: a batch is released (the callback called with it) only when
//   - every element of it was taken (the controller took the next batch, or the input ended,
//     at the top of the runner loop: never inside handle, which still reads the element);
//   - every record task admitted from it has finished (inputRef.live is zero); a task is
//     counted before anything in handle or hotRun can yield the runner role (a suspended
//     direct call hands it to another carrier, whose loop may take the next batch), and
//     uncounted in finish or at the end of hotRun's own completion;
//   - the outputs those tasks made have been handed to the sink (the output buffer was
//     flushed after the last of them finished, or held no output at all); and
//   - the run has not failed: after a failure nothing more is released, since an error or a
//     report still on its way may alias input.
// What the controller keeps beyond a task's life is copied (gate and timer keys, OperatorError
// keys, OrderInput's held outputs, state keys in the backend), which is what makes the second
// point sufficient.

// inputRef counts the live records of one input batch.
type inputRef struct {
	b    []Element
	live int  // record tasks of b admitted and not finished
	read bool // every element of b was taken
}

// WithInputRelease sets f to receive every input batch back once the controller holds no
// reference into it (see release.go): f may then reuse the batch's elements and the memory
// their keys and values point into. f runs on the runner and must not block. Batches still
// held when the run fails are never released. Default: none (the batches are left to the
// garbage collector).
func WithInputRelease(f func([]Element)) Option {
	return optionFunc(func(c *config) { c.InputRelease = f })
}

// maxRetired bounds the batches waiting for an output flush before they can be released: at
// that many the output buffer is flushed early, so that a runner that never waits (its input
// always ready) and emits little does not hold batches for long.
const maxRetired = 8

// takeInput makes b the current input batch. The previous one, whose elements were all
// taken, is marked read.
func (c *Controller) takeInput(b []Element) {
	c.inbuf = b
	if c.cfg.InputRelease == nil {
		return
	}
	c.inputRead()
	var r *inputRef
	if n := len(c.refPool); n > 0 {
		r = c.refPool[n-1]
		c.refPool = c.refPool[:n-1]
	} else {
		r = &inputRef{}
	}
	r.b, r.live, r.read = b, 0, false
	c.inRef = r
}

// inputRead marks the current batch as fully taken. Called only at the top of the runner
// loop with inbuf empty (no handle of its elements is under way), or at the end of input.
func (c *Controller) inputRead() {
	r := c.inRef
	if r == nil {
		return
	}
	c.inRef = nil
	r.read = true
	if r.live == 0 {
		c.retire(r)
	}
}

// admitInput counts t, a record task of the current batch, against the batch.
func (c *Controller) admitInput(t *task) {
	if r := c.inRef; r != nil {
		t.in = r
		r.live++
	}
}

// inputDoneBy uncounts t, which finished.
func (c *Controller) inputDoneBy(t *task) {
	r := t.in
	t.in = nil
	if r.live--; r.live == 0 && r.read {
		c.retire(r)
	}
}

// retire releases r's batch, at once if no output waits in the output buffer (an output's
// Src.Key aliases its record's key), or else after the next flush.
func (c *Controller) retire(r *inputRef) {
	b := r.b
	r.b = nil
	c.refPool = append(c.refPool, r)
	if c.err != nil || c.out.err != nil {
		return
	}
	if len(c.out.cur.Outputs) == 0 {
		c.cfg.InputRelease(b)
		return
	}
	c.retired = append(c.retired, b)
	if len(c.retired) >= maxRetired {
		if err := c.out.flush(); err != nil {
			c.fail(err)
		}
	}
}

// releaseRetired runs after every flush of the output buffer: the retired batches' outputs
// are with the sink.
func (c *Controller) releaseRetired() {
	for i, b := range c.retired {
		c.retired[i] = nil
		if c.err == nil && c.out.err == nil {
			c.cfg.InputRelease(b)
		}
	}
	c.retired = c.retired[:0]
}
