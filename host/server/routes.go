package server

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/clink-wasm/clink-wasm/host/control"
)

// route is one entry of the API surface. The same table registers the handler, writes the
// OpenAPI document and feeds the security tests.
type route struct {
	method, path string // echo syntax: /api/v1/tenants/:tenant
	public       bool   // no Authorization needed
	admin        bool   // the admin token only
	tenantScoped bool   // acts for one tenant (the token's, or ?tenant= for the admin)
	summary      string
	tag          string
	handler      echo.HandlerFunc

	query    []param
	body     string // request media type: "application/json", "application/wasm" or ""
	bodyRef  string // schema name of a JSON body
	produces string // success media type; default application/json
	success  int    // success status
	respRef  string // schema name of the success body
	errors   []int  // documented error statuses besides 401/403/429/500
}

type param struct {
	name, desc, typ string
	required        bool
}

var listParams = []param{
	{name: "limit", desc: "page size (1-1000, default 100)", typ: "integer"},
	{name: "after", desc: "the next cursor of the previous page", typ: "string"},
}

func (s *Server) routes() []route {
	tenantParam := param{name: "tenant", desc: "the tenant to act for (admin token only; a tenant token acts for its own)", typ: "string"}
	rtRoute := func(method, sub, summary string, h func(echo.Context, *control.Pipeline) error, success int, q []param, body string, errs ...int) route {
		produces, bodyRef := "", ""
		if sub == "output" {
			produces = "application/x-ndjson"
		}
		if sub == "rescale" {
			bodyRef = "Rescale"
		}
		return route{method: method, path: "/api/v1/pipelines/:id/" + sub, tenantScoped: true, tag: "pipelines", summary: summary,
			handler: s.runtimeRoute(h), query: append([]param{tenantParam}, q...), body: body, bodyRef: bodyRef, produces: produces, success: success,
			errors: append([]int{404, 501}, errs...)}
	}
	return []route{
		{method: http.MethodGet, path: "/healthz", public: true, tag: "ops", summary: "Liveness: the process answers", handler: s.healthz, success: 200, respRef: "Health"},
		{method: http.MethodGet, path: "/readyz", public: true, tag: "ops", summary: "Readiness: the control plane's store answers", handler: s.readyz, success: 200, respRef: "Health", errors: []int{503}},
		{method: http.MethodGet, path: "/openapi.json", public: true, tag: "ops", summary: "This document", handler: s.openapi, success: 200},
		{method: http.MethodGet, path: "/metrics", admin: true, tag: "ops", summary: "Prometheus metrics (admin)", handler: s.prometheus, success: 200, produces: "text/plain"},
		{method: http.MethodGet, path: "/", public: true, tag: "console", summary: "The web console", handler: s.consoleIndex, success: 200, produces: "text/html"},
		{method: http.MethodGet, path: "/assets/*", public: true, tag: "console", summary: "The web console's static files", handler: s.consoleAsset, success: 200, produces: "application/octet-stream", errors: []int{404}},

		{method: http.MethodPost, path: "/api/v1/tenants", admin: true, tag: "tenants", summary: "Create a tenant with quotas (defaults where left out); the answer holds its token, shown once",
			handler: s.createTenant, body: "application/json", bodyRef: "TenantCreate", success: 201, respRef: "TenantCreated", errors: []int{400, 409}},
		{method: http.MethodGet, path: "/api/v1/tenants", tag: "tenants", summary: "List tenants (a tenant token sees its own)", handler: s.listTenants, query: listParams, success: 200, respRef: "TenantList"},
		{method: http.MethodGet, path: "/api/v1/tenants/:tenant", tag: "tenants", summary: "A tenant's quotas and usage", handler: s.getTenant, success: 200, respRef: "Tenant", errors: []int{400, 404}},
		{method: http.MethodPatch, path: "/api/v1/tenants/:tenant", admin: true, tag: "tenants", summary: "Change a tenant's quotas (applies at once)",
			handler: s.patchTenant, body: "application/json", bodyRef: "TenantPatch", success: 200, respRef: "Tenant", errors: []int{400, 404, 409}},
		{method: http.MethodPost, path: "/api/v1/tenants/:tenant/token", admin: true, tag: "tenants", summary: "Replace a tenant's token (the old one stops working); the answer holds the new one",
			handler: s.rotateTenantToken, success: 200, respRef: "TenantCreated", errors: []int{400, 404}},

		{method: http.MethodPost, path: "/api/v1/modules", tenantScoped: true, tag: "modules", summary: "Upload a module (the .wasm bytes); it is validated against the ABI and the tenant's quotas",
			handler: s.uploadModule, body: "application/wasm", success: 201, respRef: "Module", errors: []int{400, 404, 409, 413, 415, 422},
			query: []param{{name: "name", desc: "module name (default: the manifest's)", typ: "string"}, {name: "version", desc: "version (default: the next integer for the name)", typ: "string"}, tenantParam}},
		{method: http.MethodGet, path: "/api/v1/modules", tenantScoped: true, tag: "modules", summary: "List modules", handler: s.listModules, query: append([]param{tenantParam, {name: "name", desc: "only this name's versions", typ: "string"}}, listParams...), success: 200, respRef: "ModuleList"},
		{method: http.MethodGet, path: "/api/v1/modules/:id", tenantScoped: true, tag: "modules", summary: "A module by id (sha256), NAME@VERSION or NAME (the latest version)", handler: s.getModule, query: []param{tenantParam}, success: 200, respRef: "Module", errors: []int{400, 404}},
		{method: http.MethodDelete, path: "/api/v1/modules/:id", tenantScoped: true, tag: "modules", summary: "Delete a module (refused while a pipeline uses it)", handler: s.deleteModule, query: []param{tenantParam}, success: 204, errors: []int{400, 404, 409}},

		{method: http.MethodPost, path: "/api/v1/pipelines", tenantScoped: true, tag: "pipelines", summary: "Create a pipeline record from its spec (modules by id or name)",
			handler: s.createPipeline, body: "application/json", bodyRef: "PipelineCreate", query: []param{tenantParam}, success: 201, respRef: "Pipeline", errors: []int{400, 404, 409, 422}},
		{method: http.MethodGet, path: "/api/v1/pipelines", tenantScoped: true, tag: "pipelines", summary: "List pipelines", handler: s.listPipelines, query: append([]param{tenantParam}, listParams...), success: 200, respRef: "PipelineList"},
		{method: http.MethodGet, path: "/api/v1/pipelines/:id", tenantScoped: true, tag: "pipelines", summary: "A pipeline record", handler: s.getPipeline, query: []param{tenantParam}, success: 200, respRef: "Pipeline", errors: []int{404}},
		{method: http.MethodPatch, path: "/api/v1/pipelines/:id", tenantScoped: true, tag: "pipelines", summary: "Change a pipeline's name or spec (spec: a JSON merge patch, RFC 7396)",
			handler: s.patchPipeline, body: "application/json", bodyRef: "PipelinePatch", query: []param{tenantParam}, success: 200, respRef: "Pipeline", errors: []int{400, 404, 422}},
		{method: http.MethodDelete, path: "/api/v1/pipelines/:id", tenantScoped: true, tag: "pipelines", summary: "Delete a pipeline record", handler: s.deletePipeline, query: []param{tenantParam}, success: 204, errors: []int{404}},
		{method: http.MethodGet, path: "/api/v1/pipelines/:id/checkpoints", tenantScoped: true, tag: "pipelines", summary: "The pipeline's recorded restore point and the checkpoints of its current or last run", handler: s.pipelineCheckpoints, query: []param{tenantParam}, success: 200, respRef: "Checkpoints", errors: []int{404}},
		rtRoute(http.MethodPost, "start", "Start the pipeline, from its last checkpoint if it has one; it then resumes with the server", s.startPipeline, 202, nil, "", 409, 422),
		rtRoute(http.MethodPost, "stop", "Stop the pipeline; with savepoint (query or JSON body) it takes a final savepoint first", s.stopPipeline,
			200, []param{{name: "savepoint", desc: "take a final savepoint (true/false)", typ: "boolean"}}, "", 400, 409),
		rtRoute(http.MethodPost, "savepoints", "Take a savepoint now (answers once it is committed)", s.savepointPipeline, 201, nil, "", 409, 503),
		rtRoute(http.MethodPost, "rescale", "Change operators' parallelism ({\"parallelism\": {\"OPERATOR\": N}}); a running pipeline restarts from a savepoint at the new parallelism",
			s.rescalePipeline, 200, nil, "application/json", 400, 409, 422, 503),
		rtRoute(http.MethodPost, "records", "Ingest JSON Lines into the pipeline's http source: 2xx once durable; Idempotency-Key dedupes retries; 429/503 with Retry-After when behind",
			s.ingestRecords, 200, nil, "application/x-ndjson", 400, 409, 413, 415, 503),
		rtRoute(http.MethodGet, "output", "The preview sink's latest committed outputs (JSON Lines); ?follow=1 streams them", s.pipelineOutput, 200,
			[]param{{name: "limit", desc: "lines (1-1000, default 100)", typ: "integer"}, {name: "follow", desc: "keep streaming new outputs", typ: "boolean"}, {name: "sink", desc: "the preview sink (default: the first)", typ: "string"}}, "", 400, 409),
		rtRoute(http.MethodGet, "metrics", "Live per-subtask figures of the current or last run", s.pipelineMetrics, 200, nil, ""),
		rtRoute(http.MethodGet, "errors", "Recent errors of the run, with operator, key and record", s.pipelineErrors, 200, nil, ""),
	}
}
