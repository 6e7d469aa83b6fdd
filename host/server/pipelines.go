package server

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/clink-wasm/clink-wasm/host/control"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// PipelineView is a pipeline record as the API shows it.
type PipelineView struct {
	ID         string                     `json:"id"`
	Tenant     string                     `json:"tenant"`
	Name       string                     `json:"name"`
	State      string                     `json:"state"`
	Revision   int                        `json:"revision"`
	Spec       json.RawMessage            `json:"spec"`
	Modules    []string                   `json:"modules"`
	Subtasks   int                        `json:"subtasks"`
	Checkpoint *control.CheckpointPointer `json:"checkpoint,omitempty"`
	// Running says the pipeline should run (a restarted server resumes it); Error is why it
	// last failed; Run is the runtime's view of its current or last run.
	Running   bool       `json:"running"`
	Error     string     `json:"error,omitempty"`
	Run       *RunStatus `json:"run,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	UpdatedAt time.Time  `json:"updated_at"`
}

func viewPipeline(p *control.Pipeline) PipelineView {
	return PipelineView{ID: p.ID, Tenant: p.Tenant, Name: p.Name, State: p.State, Revision: p.Revision, Spec: p.Spec,
		Modules: p.Modules, Subtasks: p.Subtasks, Checkpoint: p.Checkpoint, Running: p.Running, Error: p.Error, CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt}
}

// specRefs is the part of a pipeline spec (docs/pipeline-spec.md) the control plane checks:
// which modules it uses, how many subtasks it asks for, what it may reach and where its data
// would go. The rest belongs to the pipeline runtime and is kept as it was sent.
type specRefs struct {
	Tenant      string `json:"tenant"`
	Parallelism *int   `json:"parallelism"`
	State       struct {
		URL string `json:"url"`
	} `json:"state"`
	Sources []struct {
		Type        string `json:"type"`
		Parallelism *int   `json:"parallelism"`
	} `json:"sources"`
	Operators []struct {
		Name        string `json:"name"`
		Module      string `json:"module"`
		Parallelism *int   `json:"parallelism"`
		Endpoints   []struct {
			Name    string `json:"name"`
			BaseURL string `json:"base_url"`
		} `json:"endpoints"`
		Limits struct {
			MemoryPages uint32 `json:"memory_pages"`
			CallTimeout string `json:"call_timeout"`
			MaxInFlight int    `json:"max_in_flight"`
		} `json:"limits"`
	} `json:"operators"`
	Sinks []struct {
		Type        string `json:"type"`
		Parallelism *int   `json:"parallelism"`
		URL         string `json:"url"`
		Options     struct {
			URL string `json:"url"`
		} `json:"options"`
	} `json:"sinks"`
}

// Connector types a hosted pipeline may not use: they read or write the server's own
// filesystem or its stdout, which are no tenant's.
var (
	hostOnlySources = map[string]string{"file": "a file source reads the server's filesystem; hosted pipelines ingest over HTTP or generate records"}
	hostOnlySinks   = map[string]string{
		"file":   "a file sink writes the server's filesystem; use the preview sink, a webhook or discard",
		"stdout": "a stdout sink writes the server's own output, which every tenant shares; use the preview sink",
	}
)

func quotaProblem(field, format string, args ...any) *Problem {
	return problem(http.StatusUnprocessableEntity, CodeQuotaExceeded, field, format, args...)
}

// checkHost refuses a URL that is not http(s) or whose host the tenant may not reach.
func checkHost(t *control.Tenant, field, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return badField(field, "%q is not an http(s) URL", raw)
	}
	if !t.Quotas.HostAllowed(u.Host) {
		return quotaProblem(field, "host %q is not among tenant %q's allowed_lookup_hosts (%s)", u.Host, t.Name, orNone(t.Quotas.AllowedLookupHosts))
	}
	return nil
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// checkSpec validates spec for tenant against the catalog and returns the module ids it uses and
// its subtask count (sources, operators and sinks). self is the pipeline being changed ("" for a
// new one): its own subtasks do not count against the quota twice.
func checkSpec(cat *control.Catalog, tenant, self string, spec json.RawMessage) ([]string, int, error) {
	t, ok := cat.Tenants[tenant]
	if !ok {
		return nil, 0, notFound("tenant", tenant)
	}
	if b := bytes.TrimSpace(spec); len(b) == 0 || b[0] != '{' {
		return nil, 0, badField("spec", "the spec must be a JSON object")
	}
	var refs specRefs
	if err := json.Unmarshal(spec, &refs); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, 0, problem(http.StatusBadRequest, CodeMalformedJSON, "spec."+te.Field, "spec.%s must be %s, not a JSON %s", te.Field, jsonKind(te.Type.String()), te.Value)
		}
		return nil, 0, badField("spec", "%v", err)
	}
	if refs.Tenant != "" && refs.Tenant != tenant {
		return nil, 0, badField("spec.tenant", "the server sets the tenant; leave it out (or give %q)", tenant)
	}
	if refs.State.URL != "" {
		return nil, 0, badField("spec.state.url", "the server places each pipeline's state itself, under its tenant; leave state.url out")
	}
	if len(refs.Operators) == 0 {
		return nil, 0, badField("spec.operators", "a pipeline needs at least one operator")
	}
	par := func(p *int, def int, field string) (int, error) {
		if p == nil {
			return def, nil
		}
		if *p < 1 {
			return 0, badField(field, "parallelism must be at least 1, got %d", *p)
		}
		return *p, nil
	}
	defPar, err := par(refs.Parallelism, 1, "spec.parallelism")
	if err != nil {
		return nil, 0, err
	}
	subtasks := 0
	for i, src := range refs.Sources {
		field := fmt.Sprintf("spec.sources[%d]", i)
		if why, ok := hostOnlySources[src.Type]; ok {
			return nil, 0, problem(http.StatusUnprocessableEntity, CodeInvalidField, field+".type", "%s", why)
		}
		n, err := par(src.Parallelism, 1, field+".parallelism")
		if err != nil {
			return nil, 0, err
		}
		subtasks += n
	}
	for i, sk := range refs.Sinks {
		field := fmt.Sprintf("spec.sinks[%d]", i)
		if why, ok := hostOnlySinks[sk.Type]; ok {
			return nil, 0, problem(http.StatusUnprocessableEntity, CodeInvalidField, field+".type", "%s", why)
		}
		if sk.Type == "webhook" {
			u, f := sk.URL, field+".url"
			if u == "" {
				u, f = sk.Options.URL, field+".options.url"
			}
			if err := checkHost(t, f, u); err != nil {
				return nil, 0, err
			}
		}
		n, err := par(sk.Parallelism, 1, field+".parallelism")
		if err != nil {
			return nil, 0, err
		}
		subtasks += n
	}
	var ids []string
	q := t.Quotas
	for i, op := range refs.Operators {
		field := fmt.Sprintf("spec.operators[%d]", i)
		if op.Module == "" {
			return nil, 0, badField(field+".module", "an operator needs a module (an id, NAME@VERSION or NAME)")
		}
		m, err := resolveModule(cat, tenant, op.Module, field+".module")
		if err != nil {
			if p, ok := err.(*Problem); ok && p.Status == http.StatusNotFound {
				p.Status, p.Code, p.Title, p.Field, p.Type = http.StatusUnprocessableEntity, CodeInvalidField, titles[CodeInvalidField], field+".module", "urn:clink:problem:"+CodeInvalidField
			}
			return nil, 0, err
		}
		endpoints := map[string]bool{}
		for j, ep := range op.Endpoints {
			ef := fmt.Sprintf("%s.endpoints[%d]", field, j)
			if ep.Name == "" {
				return nil, 0, badField(ef+".name", "an endpoint needs a name")
			}
			if err := checkHost(t, ef+".base_url", ep.BaseURL); err != nil {
				return nil, 0, err
			}
			endpoints[ep.Name] = true
		}
		for _, ep := range m.Manifest.Endpoints {
			if !endpoints[ep] {
				return nil, 0, problem(http.StatusUnprocessableEntity, CodeInvalidField, field+".endpoints",
					"module %s@%s declares lookup endpoint %q but the operator defines no such endpoint", m.Name, m.Version, ep)
			}
		}
		if lp := int64(op.Limits.MemoryPages); lp*wasmPage > q.GuestMemoryBytes {
			return nil, 0, quotaProblem(field+".limits.memory_pages", "%d pages are %d bytes; tenant %q's guest_memory_bytes quota is %d", lp, lp*wasmPage, tenant, q.GuestMemoryBytes)
		}
		if op.Limits.MaxInFlight > q.MaxInFlightRecords {
			return nil, 0, quotaProblem(field+".limits.max_in_flight", "%d records in flight; tenant %q's max_in_flight_records quota is %d", op.Limits.MaxInFlight, tenant, q.MaxInFlightRecords)
		}
		if op.Limits.CallTimeout != "" {
			d, err := time.ParseDuration(op.Limits.CallTimeout)
			if err != nil || d < 0 {
				return nil, 0, badField(field+".limits.call_timeout", "%q is not a duration like \"250ms\"", op.Limits.CallTimeout)
			}
			if d > time.Duration(q.CPUTimePerRecordMs)*time.Millisecond {
				return nil, 0, quotaProblem(field+".limits.call_timeout", "%s per call; tenant %q's cpu_time_per_record_ms quota is %d", d, tenant, q.CPUTimePerRecordMs)
			}
		}
		n, err := par(op.Parallelism, defPar, field+".parallelism")
		if err != nil {
			return nil, 0, err
		}
		subtasks += n
		if !slices.Contains(ids, m.ID) {
			ids = append(ids, m.ID)
		}
	}
	used := 0
	count := 0
	had := 0 // self's subtasks before this change
	for _, p := range cat.TenantPipelines(tenant) {
		if p.ID != self {
			used += p.Subtasks
			count++
		} else {
			had = p.Subtasks
		}
	}
	if self == "" && count >= q.MaxPipelines {
		return nil, 0, quotaProblem("quotas.max_pipelines", "tenant %q has %d pipelines, its quota of %d allows no more", tenant, count, q.MaxPipelines)
	}
	// A change that adds no subtasks is accepted even while the tenant is over a lowered quota
	// (a rescale down must be possible); one that adds any must fit.
	if used+subtasks > q.MaxSubtasks && (self == "" || subtasks > had) {
		return nil, 0, quotaProblem("quotas.max_subtasks", "this spec asks for %d subtasks (sources, operators and sinks); tenant %q uses %d of its %d", subtasks, tenant, used, q.MaxSubtasks)
	}
	return ids, subtasks, nil
}

type pipelineCreate struct {
	Name string          `json:"name"`
	Spec json.RawMessage `json:"spec"`
}

func newPipelineID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "pl-" + hex.EncodeToString(b[:])
}

func (s *Server) createPipeline(c echo.Context) error {
	tenant, err := s.tenantFor(c)
	if err != nil {
		return err
	}
	var req pipelineCreate
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	if req.Name == "" {
		return badField("name", "a pipeline needs a name")
	}
	if err := validModuleName("name", req.Name); err != nil {
		return err
	}
	if len(req.Spec) == 0 {
		return badField("spec", "a pipeline needs a spec")
	}
	var view PipelineView
	err = s.ctl.Update(c.Request().Context(), func(cat *control.Catalog) error {
		for _, p := range cat.TenantPipelines(tenant) {
			if p.Name == req.Name {
				return problem(http.StatusConflict, CodeConflict, "name", "tenant %q has a pipeline named %q already (%s)", tenant, req.Name, p.ID)
			}
		}
		ids, subtasks, err := checkSpec(cat, tenant, "", req.Spec)
		if err != nil {
			return err
		}
		if err := s.validateRuntimeSpec(req.Name, tenant, req.Spec); err != nil {
			return err
		}
		now := s.ctl.Now()
		p := &control.Pipeline{ID: newPipelineID(), Tenant: tenant, Name: req.Name, Spec: compact(req.Spec), Modules: ids, Subtasks: subtasks,
			State: control.PipelineCreated, Revision: 1, CreatedAt: now, UpdatedAt: now}
		cat.Pipelines[p.ID] = p
		view = viewPipeline(p)
		return nil
	})
	if err != nil {
		return err
	}
	s.log.InfoContext(c.Request().Context(), "pipeline created", "tenant", tenant, "pipeline", view.ID)
	c.Response().Header().Set(echo.HeaderLocation, "/api/v1/pipelines/"+view.ID)
	return c.JSON(http.StatusCreated, view)
}

func compact(b json.RawMessage) json.RawMessage {
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return b
	}
	return out.Bytes()
}

// requestPipeline is the tenant a request acts for and the pipeline its :id names.
func (s *Server) requestPipeline(c echo.Context) (string, *control.Pipeline, error) {
	tenant, err := s.tenantFor(c)
	if err != nil {
		return "", nil, err
	}
	p, err := s.pipelineOf(tenant, c.Param("id"))
	return tenant, p, err
}

// pipelineOf finds tenant's pipeline id; another tenant's pipeline is not found.
func (s *Server) pipelineOf(tenant, id string) (*control.Pipeline, error) {
	if !control.ValidPipelineID(id) {
		return nil, badField("id", "%q is not a pipeline id (pl- and 16 hex digits)", id)
	}
	p, ok := s.ctl.Snapshot().Pipelines[id]
	if !ok || p.Tenant != tenant {
		return nil, notFound("pipeline", id)
	}
	return p, nil
}

func (s *Server) listPipelines(c echo.Context) error {
	tenant, err := s.tenantFor(c)
	if err != nil {
		return err
	}
	items := []PipelineView{}
	for _, p := range s.ctl.Snapshot().TenantPipelines(tenant) {
		items = append(items, s.viewPipelineLive(p))
	}
	slices.SortFunc(items, func(a, b PipelineView) int { return strings.Compare(a.ID, b.ID) })
	return page(c, items, func(v PipelineView) string { return v.ID })
}

func (s *Server) getPipeline(c echo.Context) error {
	_, p, err := s.requestPipeline(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, s.viewPipelineLive(p))
}

type pipelinePatch struct {
	Name *string         `json:"name"`
	Spec json.RawMessage `json:"spec"`
}

func (s *Server) patchPipeline(c echo.Context) error {
	tenant, err := s.tenantFor(c)
	if err != nil {
		return err
	}
	id := c.Param("id")
	if _, err := s.pipelineOf(tenant, id); err != nil {
		return err
	}
	var req pipelinePatch
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	if req.Name != nil {
		if err := validModuleName("name", *req.Name); err != nil {
			return err
		}
	}
	var specFn func(json.RawMessage) (json.RawMessage, error)
	if len(req.Spec) > 0 {
		specFn = func(old json.RawMessage) (json.RawMessage, error) {
			merged, err := mergePatch(old, req.Spec)
			if err != nil {
				return nil, badField("spec", "%v", err)
			}
			return merged, nil
		}
	}
	return s.changePipeline(c, tenant, id, req.Name, specFn)
}

// changePipeline renames pipeline id and/or changes its spec (specFn turns the stored spec into
// the new one). The new spec is checked like a new one, and for state compatibility once there
// is a checkpoint. A running pipeline takes a savepoint first (the compatibility check sees it)
// and restarts on the new spec from a savepoint.
func (s *Server) changePipeline(c echo.Context, tenant, id string, name *string, specFn func(json.RawMessage) (json.RawMessage, error)) error {
	req := struct{ Name *string }{Name: name}
	var view PipelineView
	var upgrade *run
	if s.rt != nil && specFn != nil {
		if r := s.rt.active(id); r != nil {
			// An upgrade of a running pipeline: the new spec is checked against the state of a
			// savepoint taken now, and the pipeline restarts from that savepoint.
			spID, err := r.job.Savepoint(c.Request().Context())
			if err != nil {
				return problem(http.StatusServiceUnavailable, CodeUnavailable, "", "taking the savepoint for the upgrade: %v", err)
			}
			s.rt.noteCheckpoint(r, &pipeline.CheckpointInfo{ID: spID, Savepoint: true})
			upgrade = r
		}
	}
	err := s.ctl.Update(c.Request().Context(), func(cat *control.Catalog) error {
		p, ok := cat.Pipelines[id]
		if !ok || p.Tenant != tenant {
			return notFound("pipeline", id)
		}
		if req.Name != nil && *req.Name != p.Name {
			for _, o := range cat.TenantPipelines(tenant) {
				if o.Name == *req.Name {
					return problem(http.StatusConflict, CodeConflict, "name", "tenant %q has a pipeline named %q already (%s)", tenant, o.Name, o.ID)
				}
			}
			p.Name = *req.Name
		}
		if specFn != nil {
			merged, err := specFn(p.Spec)
			if err != nil {
				return err
			}
			ids, subtasks, err := checkSpec(cat, tenant, id, merged)
			if err != nil {
				return err
			}
			if p.Checkpoint != nil {
				if err := checkStateCompatible(cat, tenant, p.Spec, merged); err != nil {
					return err
				}
			}
			if err := s.validateRuntimeSpec(p.Name, tenant, merged); err != nil {
				return err
			}
			p.Spec, p.Modules, p.Subtasks = compact(merged), ids, subtasks
			p.Revision++
		}
		p.UpdatedAt = s.ctl.Now()
		view = viewPipeline(p)
		return nil
	})
	if err != nil {
		return err
	}
	if upgrade != nil {
		if err := s.rt.restart(c.Request().Context(), upgrade, id); err != nil {
			return err
		}
		return s.pipelineStatus(c, id, http.StatusOK)
	}
	return c.JSON(http.StatusOK, view)
}

// mergePatch applies an RFC 7396 JSON merge patch to doc.
func mergePatch(doc, patch json.RawMessage) (json.RawMessage, error) {
	var d, p any
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		return nil, fmt.Errorf("the spec patch is not JSON: %w", err)
	}
	return json.Marshal(mergeValue(d, p))
}

func mergeValue(doc, patch any) any {
	pm, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	dm, ok := doc.(map[string]any)
	if !ok {
		dm = map[string]any{}
	}
	for k, v := range pm {
		if v == nil {
			delete(dm, k)
		} else {
			dm[k] = mergeValue(dm[k], v)
		}
	}
	return dm
}

func (s *Server) deletePipeline(c echo.Context) error {
	tenant, err := s.tenantFor(c)
	if err != nil {
		return err
	}
	id := c.Param("id")
	if _, err := s.pipelineOf(tenant, id); err != nil {
		return err
	}
	if s.rt != nil {
		// A running pipeline is cancelled first (its output ends at its last checkpoint).
		if r := s.rt.active(id); r != nil {
			if _, err := s.rt.stop(c.Request().Context(), r, false); err != nil {
				return problem(http.StatusInternalServerError, CodeInternal, "", "stopping the pipeline before deleting it: %v", err)
			}
		}
	}
	err = s.ctl.Update(c.Request().Context(), func(cat *control.Catalog) error {
		p, ok := cat.Pipelines[id]
		if !ok || p.Tenant != tenant {
			return notFound("pipeline", id)
		}
		delete(cat.Pipelines, id)
		return nil
	})
	if err != nil {
		return err
	}
	if s.rt != nil {
		s.rt.forget(tenant, id)
	}
	s.log.InfoContext(c.Request().Context(), "pipeline deleted", "tenant", tenant, "pipeline", id)
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) pipelineCheckpoints(c echo.Context) error {
	_, p, err := s.requestPipeline(c)
	if err != nil {
		return err
	}
	if s.rt != nil {
		return s.pipelineCheckpointsRun(c, p)
	}
	return c.JSON(http.StatusOK, map[string]any{"pipeline": p.ID, "latest": p.Checkpoint})
}

// CodeIncompatibleState: a spec change would drop keyed state a checkpoint holds.
const CodeIncompatibleState = "incompatible_state"

// checkStateCompatible refuses a spec change that would lose state: once a pipeline has a
// checkpoint, an operator whose module changes must keep every state name its old module
// declared (it may add new ones). Operators are matched by name, or by position when unnamed.
// The restore itself maps state by name.
func checkStateCompatible(cat *control.Catalog, tenant string, oldSpec, newSpec json.RawMessage) error {
	var o, n specRefs
	if json.Unmarshal(oldSpec, &o) != nil || json.Unmarshal(newSpec, &n) != nil {
		return nil // checkSpec has validated newSpec; an unreadable old spec has no state to keep
	}
	key := func(i int, name string) string {
		if name != "" {
			return "name:" + name
		}
		return fmt.Sprintf("index:%d", i)
	}
	newOps := map[string]int{}
	for i, op := range n.Operators {
		newOps[key(i, op.Name)] = i
	}
	for i, op := range o.Operators {
		oldMod, err := resolveModule(cat, tenant, op.Module, "")
		if err != nil || len(oldMod.Manifest.States) == 0 {
			continue
		}
		field := fmt.Sprintf("spec.operators[%d]", i)
		j, ok := newOps[key(i, op.Name)]
		if !ok {
			return problem(http.StatusConflict, CodeIncompatibleState, field,
				"operator %s holds checkpointed state (%s) and the new spec removes it; delete the pipeline to drop its state", opLabel(i, op.Name), strings.Join(oldMod.Manifest.States, ", "))
		}
		newMod, err := resolveModule(cat, tenant, n.Operators[j].Module, "")
		if err != nil || newMod.ID == oldMod.ID {
			continue
		}
		var missing []string
		for _, st := range oldMod.Manifest.States {
			if !slices.Contains(newMod.Manifest.States, st) {
				missing = append(missing, st)
			}
		}
		if len(missing) > 0 {
			return problem(http.StatusConflict, CodeIncompatibleState, fmt.Sprintf("spec.operators[%d].module", j),
				"module %s@%s does not declare state %s that %s@%s keeps in the last checkpoint; an upgrade may add states but not drop them",
				newMod.Name, newMod.Version, strings.Join(missing, ", "), oldMod.Name, oldMod.Version)
		}
	}
	return nil
}

func opLabel(i int, name string) string {
	if name != "" {
		return fmt.Sprintf("%q", name)
	}
	return fmt.Sprintf("#%d", i)
}

type rescaleRequest struct {
	// Parallelism maps operator names to their new parallelism.
	Parallelism map[string]int `json:"parallelism"`
}

// rescalePipeline changes operators' parallelism: for a running pipeline, a savepoint and a
// restart from it at the new parallelism (state is remapped by key group, lazily).
func (s *Server) rescalePipeline(c echo.Context, p *control.Pipeline) error {
	var req rescaleRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	if len(req.Parallelism) == 0 {
		return badField("parallelism", "name at least one operator and its new parallelism: {\"parallelism\": {\"count\": 4}}")
	}
	for name, n := range req.Parallelism {
		if n < 1 {
			return badField("parallelism."+name, "parallelism must be at least 1, got %d", n)
		}
	}
	return s.changePipeline(c, p.Tenant, p.ID, nil, func(old json.RawMessage) (json.RawMessage, error) {
		var m map[string]any
		if err := json.Unmarshal(old, &m); err != nil {
			return nil, badField("spec", "%v", err)
		}
		ops, _ := m["operators"].([]any)
		seen := map[string]bool{}
		for _, o := range ops {
			op, _ := o.(map[string]any)
			name, _ := op["name"].(string)
			if n, ok := req.Parallelism[name]; ok && op != nil {
				op["parallelism"] = n
				seen[name] = true
			}
		}
		for name := range req.Parallelism {
			if !seen[name] {
				return nil, badField("parallelism."+name, "the pipeline has no operator %q", name)
			}
		}
		return json.Marshal(m)
	})
}
