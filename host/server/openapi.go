package server

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

var echoParamRE = regexp.MustCompile(`:([A-Za-z_]+)`)

// openAPIPath turns an echo route path into an OpenAPI path template.
func openAPIPath(p string) string {
	p = echoParamRE.ReplaceAllString(p, "{$1}")
	if strings.HasSuffix(p, "/*") {
		p = strings.TrimSuffix(p, "*") + "{path}"
	}
	return p
}

// OpenAPI returns the OpenAPI 3.1 document of the routes.
func (s *Server) OpenAPI() map[string]any {
	paths := map[string]any{}
	for _, r := range s.routes() {
		op := map[string]any{
			"operationId": operationID(r),
			"summary":     r.summary,
			"tags":        []string{r.tag},
		}
		if r.public {
			op["security"] = []any{}
		}
		var params []any
		for _, m := range echoParamRE.FindAllStringSubmatch(r.path, -1) {
			params = append(params, map[string]any{"name": m[1], "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
		}
		if strings.HasSuffix(r.path, "/*") {
			params = append(params, map[string]any{"name": "path", "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
		}
		for _, q := range r.query {
			params = append(params, map[string]any{"name": q.name, "in": "query", "required": q.required, "description": q.desc, "schema": map[string]any{"type": q.typ}})
		}
		if len(params) > 0 {
			op["parameters"] = params
		}
		switch r.body {
		case "application/json":
			op["requestBody"] = map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{"schema": ref(r.bodyRef)}}}
		case "application/x-ndjson":
			op["requestBody"] = map[string]any{"required": true, "content": map[string]any{"application/x-ndjson": map[string]any{"schema": map[string]any{"type": "string", "description": "JSON Lines: one JSON object a line"}}}}
		case "application/wasm":
			op["requestBody"] = map[string]any{"required": true, "content": map[string]any{"application/wasm": map[string]any{"schema": map[string]any{"type": "string", "format": "binary"}}}}
		}
		resp := map[string]any{}
		ok := map[string]any{"description": http.StatusText(r.success)}
		if r.success != http.StatusNoContent {
			mt := r.produces
			if mt == "" {
				mt = "application/json"
			}
			schema := map[string]any{}
			if r.respRef != "" {
				schema = ref(r.respRef)
			}
			ok["content"] = map[string]any{mt: map[string]any{"schema": schema}}
		}
		resp[strconv.Itoa(r.success)] = ok
		errs := append([]int{}, r.errors...)
		if !r.public {
			errs = append(errs, 401, 403, 429)
		}
		errs = append(errs, 500)
		for _, code := range errs {
			resp[strconv.Itoa(code)] = map[string]any{"$ref": "#/components/responses/Problem"}
		}
		op["responses"] = resp
		item, _ := paths[openAPIPath(r.path)].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[openAPIPath(r.path)] = item
		}
		item[strings.ToLower(r.method)] = op
	}
	return map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{
			"title":       "clink-wasm platform API",
			"version":     "v1",
			"description": "Multi-tenant hosting of WebAssembly stream operators. Every error is an RFC 9457 problem with a stable code and the field at fault.",
		},
		"security": []any{map[string]any{"bearer": []any{}}},
		"paths":    paths,
		"components": map[string]any{
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer", "description": "an admin token (clk_admin_...) or a tenant token (clk_t_...)"}},
			"responses": map[string]any{"Problem": map[string]any{
				"description": "an RFC 9457 problem",
				"content":     map[string]any{"application/problem+json": map[string]any{"schema": ref("Problem")}},
			}},
			"schemas": schemas(),
		},
	}
}

func operationID(r route) string {
	p := strings.NewReplacer("/api/v1/", "", ":", "", "/*", "", "/", "_", ".", "_").Replace(r.path)
	if p == "" || p == "/" {
		p = "console"
	}
	return strings.ToLower(r.method) + "_" + strings.Trim(p, "_")
}

func ref(name string) map[string]any { return map[string]any{"$ref": "#/components/schemas/" + name} }

func obj(props map[string]any, required ...string) map[string]any {
	o := map[string]any{"type": "object", "properties": props}
	if len(required) > 0 {
		o["required"] = required
	}
	return o
}

var (
	str   = map[string]any{"type": "string"}
	integ = map[string]any{"type": "integer"}
	tim   = map[string]any{"type": "string", "format": "date-time"}
)

func arr(items any) map[string]any { return map[string]any{"type": "array", "items": items} }

func schemas() map[string]any {
	quotas := map[string]any{
		"max_pipelines": integ, "max_subtasks": integ, "guest_memory_bytes": integ, "cpu_time_per_record_ms": integ, "guest_cpu_millicores": integ,
		"max_in_flight_records": integ, "hot_tier_bytes": integ, "state_bytes": integ, "lookup_requests_per_second": integ,
		"allowed_lookup_hosts": arr(str), "allowed_kafka_brokers": arr(str), "api_requests_per_second": integ, "max_modules": integ, "max_module_bytes": integ,
	}
	usage := obj(map[string]any{"pipelines": integ, "subtasks": integ, "modules": integ, "module_bytes": integ, "state_bytes": integ})
	overQuota := map[string]any{"type": "array", "items": obj(map[string]any{"quota": str, "used": integ, "limit": integ}, "quota", "used", "limit"),
		"description": "the admission quotas (max_pipelines, max_subtasks, max_modules, state_bytes) the tenant's usage is above, after a PATCH lowered them: nothing is stopped for it; what would add usage (a new pipeline or module, a start, a change or rescale adding subtasks) is refused with 422 naming the quota, and what does not (running pipelines, their resumption after a restart, a rescale down) goes on. Absent within every quota"}
	tenant := map[string]any{"name": str, "quotas": ref("Quotas"), "usage": usage, "over_quota": overQuota, "created_at": tim, "updated_at": tim}
	tenantCreated := map[string]any{"token": str}
	for k, v := range tenant {
		tenantCreated[k] = v
	}
	manifest := obj(map[string]any{"abi": integ, "name": str, "states": arr(str), "prefetch": arr(str), "endpoints": arr(str)})
	module := obj(map[string]any{"id": str, "name": str, "version": str, "ref": str, "tenant": str, "size": integ, "manifest": manifest, "memory": str, "created_at": tim, "used_by": arr(str)})
	checkpoint := obj(map[string]any{"id": integ, "url": str, "savepoint": map[string]any{"type": "boolean"}, "at": tim})
	pipeline := obj(map[string]any{"id": str, "tenant": str, "name": str, "state": str, "revision": integ, "spec": map[string]any{"type": "object"},
		"modules": arr(str), "subtasks": integ, "checkpoint": checkpoint, "created_at": tim, "updated_at": tim})
	list := func(item string) map[string]any {
		return obj(map[string]any{"items": arr(ref(item)), "next": str}, "items")
	}
	return map[string]any{
		"Problem": obj(map[string]any{
			"type": str, "title": str, "status": integ, "detail": str, "instance": str, "code": str, "field": str,
			"problems": arr(obj(map[string]any{"source": str, "detail": str})),
		}, "type", "title", "status", "code"),
		"Health":        obj(map[string]any{"status": str}),
		"Quotas":        obj(quotas),
		"Tenant":        obj(tenant),
		"TenantCreated": obj(tenantCreated),
		"TenantCreate":  obj(map[string]any{"name": str, "quotas": ref("Quotas")}, "name"),
		"TenantPatch":   obj(map[string]any{"quotas": ref("Quotas")}, "quotas"),
		"TenantList":    list("Tenant"),
		"Module":        module,
		"ModuleList":    list("Module"),
		"Pipeline":      pipeline,
		"PipelineList":  list("Pipeline"),
		"PipelineCreate": obj(map[string]any{"name": str, "spec": map[string]any{
			"type":        "object",
			"description": "a pipeline spec (docs/pipeline-spec.md); the server checks the fields below and keeps the rest as sent. It refuses state.url, file sources and sinks, stdout sinks, and hosts outside allowed_lookup_hosts",
			"required":    []string{"operators"},
			"properties": map[string]any{
				"parallelism": integ,
				"sources":     arr(obj(map[string]any{"name": str, "type": str, "parallelism": integ})),
				"operators": arr(obj(map[string]any{
					"name": str, "module": map[string]any{"type": "string", "description": "sha256:HEX, HEX, NAME@VERSION or NAME (the latest)"}, "parallelism": integ,
					"endpoints": arr(obj(map[string]any{"name": str, "base_url": str}, "name", "base_url")),
					"limits":    obj(map[string]any{"memory_pages": integ, "call_timeout": str, "max_in_flight": integ}),
				}, "module")),
				"sinks": arr(obj(map[string]any{"name": str, "type": str, "parallelism": integ, "url": str})),
			},
		}}, "name", "spec"),
		"Rescale":       obj(map[string]any{"parallelism": map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "integer", "minimum": 1}, "description": "operator name → new parallelism"}}),
		"PipelinePatch": obj(map[string]any{"name": str, "spec": map[string]any{"type": "object", "description": "a JSON merge patch (RFC 7396) of the spec"}}),
		"Checkpoints":   obj(map[string]any{"pipeline": str, "latest": checkpoint}),
	}
}

var (
	openapiOnce sync.Once
	openapiDoc  map[string]any
)

func (s *Server) openapi(c echo.Context) error {
	openapiOnce.Do(func() { openapiDoc = s.OpenAPI() })
	return c.JSONPretty(http.StatusOK, openapiDoc, "  ")
}

func (s *Server) prometheus(c echo.Context) error {
	promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}).ServeHTTP(c.Response(), c.Request())
	return nil
}
