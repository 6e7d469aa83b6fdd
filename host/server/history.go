package server

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/clink-wasm/clink-wasm/host/control"
)

// # Run history
//
// A pipeline's run views, its captured errors and its checkpoint history (each bounded: the
// newest maxCapturedErrors and maxCheckpointHistory), are kept in the control store under
// runs/<tenant>/<id>.json, so that they survive a server restart: a new run continues the
// pipeline's history, and a pipeline that is not running shows the history of its last run.
// The watcher writes the object when the history changed, at most once per historyFlushEvery,
// and once more when the run ends; a crash loses at most the last historyFlushEvery of it.
// Deleting the pipeline deletes the object.

const historyFlushEvery = time.Second

// runHistory is the stored form of a run's views.
type runHistory struct {
	Errors      []CapturedError  `json:"errors"`
	Checkpoints []CheckpointView `json:"checkpoints"`
}

func historyName(tenant, id string) string { return "runs/" + tenant + "/" + id + ".json" }

// loadHistory reads pipeline id's stored history (empty when there is none).
func (rt *runtime) loadHistory(ctx context.Context, tenant, id string) (runHistory, error) {
	var h runHistory
	if !control.ValidTenantName(tenant) || !control.ValidPipelineID(id) {
		return h, errors.New("bad tenant or pipeline id")
	}
	b, _, err := rt.s.ctl.Store().Get(ctx, historyName(tenant, id))
	if errors.Is(err, control.ErrNotFound) {
		return h, nil
	}
	if err != nil {
		return h, err
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return runHistory{}, err
	}
	return h, nil
}

// saveHistory writes r's history if it changed since the last write (or always, with force).
func (rt *runtime) saveHistory(r *run, force bool) {
	r.mu.Lock()
	if !r.histDirty || (!force && time.Since(r.histSaved) < historyFlushEvery) {
		r.mu.Unlock()
		return
	}
	h := runHistory{Errors: append([]CapturedError{}, r.errs...), Checkpoints: append([]CheckpointView{}, r.cps...)}
	r.histDirty, r.histSaved = false, time.Now()
	r.mu.Unlock()
	b, err := json.Marshal(h)
	if err == nil {
		err = rt.putLatest(historyName(r.tenant, r.id), b)
	}
	if err != nil {
		r.mu.Lock()
		r.histDirty = true // the next tick tries again
		r.mu.Unlock()
		rt.s.log.Warn("saving a pipeline's run history failed", "pipeline", r.id, "err", err)
	}
}

// putLatest overwrites object name (one writer per pipeline: this server).
func (rt *runtime) putLatest(name string, b []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st := rt.s.ctl.Store()
	var err error
	for range 3 {
		var gen string
		if _, gen, err = st.Get(ctx, name); err != nil && !errors.Is(err, control.ErrNotFound) {
			return err
		}
		if _, err = st.Put(ctx, name, b, gen); !errors.Is(err, control.ErrConflict) {
			return err
		}
	}
	return err
}

// seedHistory gives a new run the history of the pipeline's previous run: prev's when it ran
// in this process, else the stored one.
func (rt *runtime) seedHistory(ctx context.Context, r, prev *run) {
	if prev != nil {
		prev.mu.Lock()
		r.errs, r.cps, r.lastCP = append([]CapturedError{}, prev.errs...), append([]CheckpointView{}, prev.cps...), prev.lastCP
		prev.mu.Unlock()
		return
	}
	h, err := rt.loadHistory(ctx, r.tenant, r.id)
	if err != nil {
		rt.s.log.Warn("reading a pipeline's run history failed", "pipeline", r.id, "err", err)
		return
	}
	r.errs, r.cps = h.Errors, h.Checkpoints
	for _, c := range h.Checkpoints {
		r.lastCP = max(r.lastCP, c.ID)
	}
}

// history returns pipeline p's errors and checkpoint history: the run's in this process, else
// the stored ones.
func (rt *runtime) history(ctx context.Context, p *control.Pipeline) (runHistory, error) {
	if r := rt.get(p.ID); r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		return runHistory{Errors: append([]CapturedError{}, r.errs...), Checkpoints: append([]CheckpointView{}, r.cps...)}, nil
	}
	return rt.loadHistory(ctx, p.Tenant, p.ID)
}
