package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/control"
)

// publicRoutes are the only routes that answer without a token. TestEveryRouteNeedsAToken
// fails if a route is public without being listed here.
var publicRoutes = []string{"GET /", "GET /assets/*", "GET /healthz", "GET /openapi.json", "GET /readyz"}

type secFixture struct {
	e                  *env
	tokA, tokB         string
	moduleA, pipelineA string
	before             []byte
}

func newSecFixture(t *testing.T) *secFixture {
	e := newEnv(t)
	f := &secFixture{e: e}
	f.tokA = e.tenant("a", map[string]any{"api_requests_per_second": 100000})
	f.tokB = e.tenant("b", map[string]any{"api_requests_per_second": 100000})
	r := e.upload(f.tokA, "?name=counter", fixture(t, "counter.wasm"))
	var m ModuleView
	r.decode(t, &m)
	f.moduleA = m.ID
	r = e.json("POST", "/api/v1/pipelines", f.tokA, map[string]any{"name": "pa", "spec": hosted(map[string]any{"operators": []any{map[string]any{"module": m.ID}}})})
	var p PipelineView
	r.decode(t, &p)
	if r.code != 201 {
		t.Fatalf("pipeline: %d %s", r.code, r.body)
	}
	f.pipelineA = p.ID
	f.before = f.recordsOfA(t)
	return f
}

// recordsOfA is everything the catalog holds about tenant a.
func (f *secFixture) recordsOfA(t *testing.T) []byte {
	cat := f.e.ctl.Snapshot()
	b, err := json.Marshal([]any{cat.Tenants["a"], cat.TenantModules("a"), cat.TenantPipelines("a")})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// request builds a plausible request for route r aimed at tenant a's records, so that a
// handler that forgot a check would act on them.
func (f *secFixture) request(t *testing.T, method, path string) (string, string, []byte) {
	p := strings.NewReplacer(":tenant", "a", "*", "app.js").Replace(path)
	if strings.HasPrefix(path, "/api/v1/modules/:id") {
		p = strings.Replace(path, ":id", f.moduleA, 1)
	}
	if strings.HasPrefix(path, "/api/v1/pipelines/:id") {
		p = strings.Replace(path, ":id", f.pipelineA, 1)
	}
	switch {
	case method == "POST" && path == "/api/v1/modules":
		return p, "application/wasm", fixture(t, "fast.wasm")
	case method == "POST" && path == "/api/v1/tenants":
		return p, "application/json", []byte(`{"name":"evil"}`)
	case method == "PATCH" && path == "/api/v1/tenants/:tenant":
		return p, "application/json", []byte(`{"quotas":{"max_pipelines":999}}`)
	case method == "POST" && path == "/api/v1/pipelines":
		return p, "application/json", []byte(`{"name":"hijack","spec":{"sources":[{"name":"in","type":"http"}],"operators":[{"name":"o","inputs":["in"],"module":"` + f.moduleA + `"}],"sinks":[{"name":"out","type":"preview","inputs":["o"]}]}}`)
	case method == "PATCH" && path == "/api/v1/pipelines/:id":
		return p, "application/json", []byte(`{"name":"hijacked"}`)
	case method == "POST":
		return p, "application/json", []byte(`{}`)
	}
	return p, "", nil
}

func withQuery(p, q string) string {
	if strings.Contains(p, "?") {
		return p + "&" + q
	}
	return p + "?" + q
}

func TestEveryRouteNeedsAToken(t *testing.T) {
	f := newSecFixture(t)
	routes := f.e.srv.echo.Routes()
	if len(routes) < 20 {
		t.Fatalf("only %d routes", len(routes))
	}
	var public []string
	for _, rt := range routes {
		path, ctype, body := f.request(t, rt.Method, rt.Path)
		name := rt.Method + " " + rt.Path
		noTok := f.e.do(rt.Method, path, "", ctype, body)
		if noTok.code != http.StatusUnauthorized {
			public = append(public, name)
			if noTok.code >= 500 {
				t.Errorf("%s without a token: %d", name, noTok.code)
			}
			continue
		}
		if p := noTok.problem(t); p.Code != CodeUnauthenticated || p.Field != "Authorization" || noTok.hdr.Get("WWW-Authenticate") == "" {
			t.Errorf("%s without a token: %+v", name, p)
		}
		for _, bad := range []string{"clk_t_not-a-real-token", "Basic dXNlcjpwYXNz", testAdmin + "x"} {
			req := bad
			r := f.e.do(rt.Method, path, "", ctype, body)
			if strings.HasPrefix(bad, "Basic") {
				r = f.e.doAuth(rt.Method, path, bad, ctype, body)
			} else {
				r = f.e.do(rt.Method, path, req, ctype, body)
			}
			if r.code != http.StatusUnauthorized {
				t.Errorf("%s with a wrong token %q: %d %s", name, bad, r.code, r.body)
			}
		}
	}
	sort.Strings(public)
	if !slices.Equal(public, publicRoutes) {
		t.Fatalf("public routes are %v, want %v", public, publicRoutes)
	}
	if !bytes.Equal(f.recordsOfA(t), f.before) {
		t.Fatal("unauthenticated requests changed tenant a's records")
	}
}

func (e *env) doAuth(method, path, auth, ctype string, body []byte) resp {
	e.t.Helper()
	req, _ := http.NewRequest(method, path, bytes.NewReader(body))
	req.Header.Set("Authorization", auth)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	return e.serve(req)
}

// TestAnotherTenantsToken runs every route with tenant b's token against tenant a's records,
// with and without ?tenant=a: b never sees a's data and never changes a's records.
func TestAnotherTenantsToken(t *testing.T) {
	f := newSecFixture(t)
	aData := [][]byte{[]byte(f.moduleA), []byte(f.pipelineA), []byte(`"tenant":"a"`), []byte(`"name":"a"`)}
	for _, rt := range f.e.srv.echo.Routes() {
		name := rt.Method + " " + rt.Path
		if slices.Contains(publicRoutes, name) {
			continue
		}
		path, ctype, body := f.request(t, rt.Method, rt.Path)
		for _, p := range []string{path, withQuery(path, "tenant=a")} {
			r := f.e.do(rt.Method, p, f.tokB, ctype, body)
			switch {
			case r.code == 403 || r.code == 404 || r.code == 422:
				if r.code == 422 && !strings.Contains(string(r.body), "does not exist") {
					t.Errorf("%s as b: 422 for another reason: %s", p, r.body)
				}
			case r.code >= 200 && r.code < 300:
				for _, d := range aData {
					if bytes.Contains(r.body, d) {
						t.Errorf("%s %s as b: %d shows a's data (%s): %s", rt.Method, p, r.code, d, r.body)
					}
				}
			default:
				t.Errorf("%s %s as b: %d %s", rt.Method, p, r.code, r.body)
			}
		}
		// The admin route table entries refuse tenant tokens.
	}
	if !bytes.Equal(f.recordsOfA(t), f.before) {
		t.Fatalf("tenant b changed tenant a's records:\nbefore %s\nafter  %s", f.before, f.recordsOfA(t))
	}
	// And a's own token still reaches its records, so the refusals above were not accidents of
	// the request shapes.
	for _, p := range []string{"/api/v1/modules/" + f.moduleA, "/api/v1/pipelines/" + f.pipelineA, "/api/v1/tenants/a"} {
		if r := f.e.do("GET", p, f.tokA, "", nil); r.code != 200 {
			t.Errorf("a's own GET %s: %d", p, r.code)
		}
		if r := f.e.do("GET", withQuery(p, "tenant=a"), testAdmin, "", nil); r.code != 200 {
			t.Errorf("admin GET %s: %d", p, r.code)
		}
	}
}

func TestAdminRoutesRefuseTenantTokens(t *testing.T) {
	f := newSecFixture(t)
	n := 0
	for _, r := range f.e.srv.routes() {
		if !r.admin {
			continue
		}
		n++
		path, ctype, body := f.request(t, r.method, r.path)
		for _, tok := range []string{f.tokA, f.tokB} {
			if got := f.e.do(r.method, path, tok, ctype, body); got.code != 403 || got.problem(t).Code != CodeForbidden {
				t.Errorf("%s %s with a tenant token: %d", r.method, r.path, got.code)
			}
		}
	}
	if n < 4 {
		t.Fatalf("only %d admin routes", n)
	}
	if _, ok := f.e.ctl.Snapshot().Tenants["evil"]; ok {
		t.Fatal("a tenant token created a tenant")
	}
	if got := f.e.ctl.Snapshot().Tenants["a"].Quotas; got.MaxPipelines == 999 {
		t.Fatal("a tenant token changed quotas")
	}
}

func TestAdminNeedsATenantForTenantRoutes(t *testing.T) {
	e := newEnv(t)
	e.tenant("a", nil)
	r := e.upload(testAdmin, "", fixture(t, "counter.wasm"))
	if p := r.problem(t); r.code != 400 || p.Field != "tenant" {
		t.Fatalf("admin upload without tenant: %d %s", r.code, r.body)
	}
	if r := e.upload(testAdmin, "?tenant=nosuch", fixture(t, "counter.wasm")); r.code != 404 {
		t.Fatalf("unknown tenant: %d", r.code)
	}
	if r := e.upload(testAdmin, "?tenant=a", fixture(t, "counter.wasm")); r.code != 201 {
		t.Fatalf("admin upload for a: %d %s", r.code, r.body)
	}
	if len(e.ctl.Snapshot().TenantModules("a")) != 1 {
		t.Fatal("module not registered for a")
	}
	_ = control.DefaultQuotas
}
