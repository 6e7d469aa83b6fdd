package server

import (
	"bufio"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/clink-wasm/clink-wasm/host/connector/ingest"
	"github.com/clink-wasm/clink-wasm/host/control"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// The run-time routes of a pipeline: start, stop, savepoints, records, output, metrics, errors
// and checkpoints. See runtime.go for how runs are kept.

const (
	defaultOutputLines = 100
	maxOutputLines     = 1000
	maxOutputBytes     = 4 << 20
	followPollEvery    = 100 * time.Millisecond
)

// runtimeRoute wraps a run-time handler: 501 when this server runs no pipelines, and the
// tenant's own pipeline found first (another tenant's is not found).
func (s *Server) runtimeRoute(h func(c echo.Context, p *control.Pipeline) error) echo.HandlerFunc {
	return func(c echo.Context) error {
		_, p, err := s.requestPipeline(c)
		if err != nil {
			return err
		}
		if s.rt == nil {
			return problem(http.StatusNotImplemented, CodeRuntimeUnavailable, "", "pipeline runtime not available: this server was started without a data URL")
		}
		return h(c, p)
	}
}

func notRunning(p *control.Pipeline) *Problem {
	pr := problem(http.StatusConflict, CodeConflict, "", "pipeline %s is not running (state %s); start it first", p.ID, p.State)
	return pr
}

func (s *Server) startPipeline(c echo.Context, p *control.Pipeline) error {
	if _, err := s.rt.start(c.Request().Context(), p); err != nil {
		if errors.Is(err, ErrAlreadyRunning) {
			return problem(http.StatusConflict, CodeConflict, "", "pipeline %s is running already", p.ID)
		}
		var pr *Problem
		if errors.As(err, &pr) {
			return err
		}
		return problem(http.StatusUnprocessableEntity, CodeInvalidField, "spec", "%v", err)
	}
	s.log.InfoContext(c.Request().Context(), "pipeline started", "tenant", p.Tenant, "pipeline", p.ID)
	return s.pipelineStatus(c, p.ID, http.StatusAccepted)
}

type stopRequest struct {
	Savepoint *bool `json:"savepoint"`
}

func (s *Server) stopPipeline(c echo.Context, p *control.Pipeline) error {
	var req stopRequest
	if c.Request().ContentLength != 0 {
		if err := decodeJSON(c, &req); err != nil {
			return err
		}
	}
	savepoint := false
	if q := c.QueryParam("savepoint"); q != "" {
		b, err := strconv.ParseBool(q)
		if err != nil {
			return badField("savepoint", "want true or false, not %q", q)
		}
		savepoint = b
	}
	if req.Savepoint != nil {
		savepoint = *req.Savepoint
	}
	r := s.rt.active(p.ID)
	if r == nil {
		// Not running here: make sure it will not be resumed either.
		f := false
		st := p.State
		if st == control.PipelineRunning {
			st = control.PipelineStopped
		}
		if err := s.ctl.SetPipelineState(c.Request().Context(), p.ID, st, p.Error, &f); err != nil {
			return err
		}
		return notRunning(p)
	}
	f := false
	// Cleared first: a crash during the stop must not resume what the user stopped.
	if err := s.ctl.SetPipelineState(c.Request().Context(), p.ID, control.PipelineRunning, "", &f); err != nil {
		return err
	}
	id, err := s.rt.stop(c.Request().Context(), r, savepoint)
	if err != nil {
		return problem(http.StatusInternalServerError, CodeInternal, "", "stopping: %v", err)
	}
	s.log.InfoContext(c.Request().Context(), "pipeline stopped", "tenant", p.Tenant, "pipeline", p.ID, "savepoint", id)
	return c.JSON(http.StatusOK, map[string]any{"pipeline": p.ID, "state": control.PipelineStopped, "savepoint": id})
}

func (s *Server) savepointPipeline(c echo.Context, p *control.Pipeline) error {
	r := s.rt.active(p.ID)
	if r == nil {
		return notRunning(p)
	}
	id, err := r.job.Savepoint(c.Request().Context())
	if errors.Is(err, pipeline.ErrNotRunning) {
		pr := problem(http.StatusServiceUnavailable, CodeUnavailable, "", "pipeline %s is not running now (restarting or ending); retry", p.ID)
		pr.retryAfter = 1
		return pr
	}
	if err != nil {
		return problem(http.StatusInternalServerError, CodeInternal, "", "savepoint: %v", err)
	}
	s.rt.noteCheckpoint(r, &pipeline.CheckpointInfo{ID: id, Savepoint: true})
	return c.JSON(http.StatusCreated, map[string]any{"pipeline": p.ID, "savepoint": id, "url": r.stateURL})
}

// ingestTypes are the media types POST …/records takes.
var ingestTypes = map[string]bool{"application/x-ndjson": true, "application/jsonl": true, "application/json": true, "application/jsonlines": true, "text/plain": true}

func (s *Server) ingestRecords(c echo.Context, p *control.Pipeline) error {
	req := c.Request()
	mt, _, _ := mime.ParseMediaType(req.Header.Get(echo.HeaderContentType))
	if mt != "" && !ingestTypes[mt] {
		return problem(http.StatusUnsupportedMediaType, CodeUnsupportedMedia, "Content-Type", "send JSON Lines as application/x-ndjson, not %q", mt)
	}
	key := req.Header.Get("Idempotency-Key")
	if key != "" && !ingest.ValidKey(key) {
		return badField("Idempotency-Key", "1-128 printable ASCII characters without spaces")
	}
	r := s.rt.active(p.ID)
	if r == nil {
		pr := problem(http.StatusServiceUnavailable, CodeUnavailable, "", "pipeline %s is not running (state %s): start it, then retry", p.ID, p.State)
		pr.retryAfter = 5
		return pr
	}
	if !r.ingests {
		return problem(http.StatusConflict, CodeConflict, "", "pipeline %s has no http source to ingest into", p.ID)
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), req.Body, s.cfg.MaxIngestBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return problem(http.StatusRequestEntityTooLarge, CodeTooLarge, "", "a records request holds at most %d bytes; send smaller batches", s.cfg.MaxIngestBytes)
		}
		return problem(http.StatusBadRequest, CodeInvalidField, "", "reading the body: %v", err)
	}
	res, err := r.log.Append(key, body)
	var bad *ingest.BadRecordError
	switch {
	case errors.As(err, &bad):
		return badField("body", "line %d: %s (nothing of this request was ingested)", bad.Line, bad.Reason)
	case errors.Is(err, ingest.ErrBackpressure):
		pr := problem(http.StatusTooManyRequests, CodeRateLimited, "", "pipeline %s is behind by %d bytes of ingested records; retry later", p.ID, r.log.Lag())
		pr.retryAfter = 1
		s.metrics.ingestRefused.WithLabelValues(p.Tenant, "backpressure").Inc()
		return pr
	case errors.Is(err, ingest.ErrClosed):
		pr := problem(http.StatusServiceUnavailable, CodeUnavailable, "", "pipeline %s is stopping; retry once it runs", p.ID)
		pr.retryAfter = 5
		return pr
	case err != nil:
		return problem(http.StatusInternalServerError, CodeInternal, "", "ingest: %v", err)
	}
	if res.Duplicate {
		c.Response().Header().Set("Idempotent-Replayed", "true")
	} else {
		s.metrics.ingested.WithLabelValues(p.Tenant).Add(float64(res.Records))
	}
	return c.JSON(http.StatusOK, res)
}

// previewOf is the directory and sink name of the pipeline's first preview sink (or the one
// ?sink= names).
func (s *Server) previewOf(c echo.Context, p *control.Pipeline) (string, string, error) {
	spec, err := runtimeSpec(p.Name, p.Tenant, p.Spec)
	if err != nil {
		return "", "", err
	}
	want := c.QueryParam("sink")
	for _, sk := range spec.Sinks {
		if sk.Type == ingest.SinkType && (want == "" || want == sk.Name) {
			dir, err := s.rt.runDir(p.Tenant, p.ID)
			if err != nil {
				return "", "", err
			}
			return previewDir(dir), sk.Name, nil
		}
	}
	if want != "" {
		return "", "", notFound("preview sink", want)
	}
	return "", "", problem(http.StatusConflict, CodeConflict, "", "pipeline %s has no preview sink", p.ID)
}

func (s *Server) pipelineOutput(c echo.Context, p *control.Pipeline) error {
	dir, sink, err := s.previewOf(c, p)
	if err != nil {
		return err
	}
	n := defaultOutputLines
	if q := c.QueryParam("limit"); q != "" {
		v, err := strconv.Atoi(q)
		if err != nil || v < 1 || v > maxOutputLines {
			return badField("limit", "want 1-%d, not %q", maxOutputLines, q)
		}
		n = v
	}
	follow := false
	if q := c.QueryParam("follow"); q != "" {
		b, err := strconv.ParseBool(q)
		if err != nil {
			return badField("follow", "want 1 or 0, not %q", q)
		}
		follow = b
	}
	lines, cur, err := ingest.TailPreview(dir, sink, n, maxOutputBytes)
	if err != nil {
		return err
	}
	w := c.Response()
	w.Header().Set(echo.HeaderContentType, "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	write := func(lines [][]byte) error {
		for _, l := range lines {
			bw.Write(l)
			bw.WriteByte('\n')
		}
		if err := bw.Flush(); err != nil {
			return err
		}
		w.Flush()
		return nil
	}
	if err := write(lines); err != nil || !follow {
		return nil
	}
	ctx := c.Request().Context()
	t := time.NewTicker(followPollEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.rt.ctx.Done():
			return nil
		case <-s.quit:
			return nil
		case <-t.C:
		}
		lines, next, err := ingest.FollowPreview(dir, sink, cur, maxOutputBytes)
		if err != nil {
			return nil
		}
		cur = next
		if len(lines) > 0 {
			if err := write(lines); err != nil {
				return nil
			}
		}
	}
}

func (s *Server) pipelineMetrics(c echo.Context, p *control.Pipeline) error {
	r := s.rt.get(p.ID)
	if r == nil {
		return c.JSON(http.StatusOK, map[string]any{"pipeline": p.ID, "state": p.State})
	}
	m := r.metrics()
	return c.JSON(http.StatusOK, map[string]any{"pipeline": p.ID, "state": p.State, "job": m, "ingest_lag_bytes": r.log.Lag(), "ingest_bytes": r.log.Durable()})
}

func (r *run) metrics() pipeline.JobMetrics {
	r.mu.Lock()
	f := r.final
	r.mu.Unlock()
	if f != nil {
		return *f
	}
	return r.job.Metrics()
}

func (s *Server) pipelineErrors(c echo.Context, p *control.Pipeline) error {
	h, err := s.rt.history(c.Request().Context(), p)
	if err != nil {
		return err
	}
	items := append([]CapturedError{}, h.Errors...)
	return c.JSON(http.StatusOK, map[string]any{"pipeline": p.ID, "error": p.Error, "items": items})
}

func (s *Server) pipelineCheckpointsRun(c echo.Context, p *control.Pipeline) error {
	h, err := s.rt.history(c.Request().Context(), p)
	if err != nil {
		return err
	}
	items := append([]CheckpointView{}, h.Checkpoints...)
	return c.JSON(http.StatusOK, map[string]any{"pipeline": p.ID, "latest": p.Checkpoint, "items": items})
}

// pipelineStatus answers with the pipeline record as it is now.
func (s *Server) pipelineStatus(c echo.Context, id string, code int) error {
	p, ok := s.ctl.Snapshot().Pipelines[id]
	if !ok {
		return notFound("pipeline", id)
	}
	return c.JSON(code, s.viewPipelineLive(p))
}

// RunStatus is what the runtime says of a pipeline's current (or last) run.
type RunStatus struct {
	State      pipeline.JobState `json:"state"`
	Attempts   int               `json:"attempts"`
	Restarts   int               `json:"restarts"`
	Restored   uint64            `json:"restored"`
	RecordsIn  int64             `json:"records_in"`  // read by the sources
	RecordsOut int64             `json:"records_out"` // written by the sinks
	Error      string            `json:"error,omitempty"`
}

func (s *Server) viewPipelineLive(p *control.Pipeline) PipelineView {
	v := viewPipeline(p)
	if s.rt == nil {
		return v
	}
	if r := s.rt.get(p.ID); r != nil && r.job != nil {
		m := r.metrics()
		st := &RunStatus{State: m.State, Attempts: m.Attempts, Restarts: m.Restarts, Restored: m.Restored, Error: m.Error}
		for _, sm := range m.Sources {
			st.RecordsIn += sm.RecordsIn
		}
		for _, sm := range m.Sinks {
			st.RecordsOut += sm.RecordsIn
		}
		v.Run = st
	}
	return v
}
