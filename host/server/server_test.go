package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/clink-wasm/clink-wasm/host/control"
)

const testAdmin = "clk_admin_test-token-0123456789"

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type env struct {
	t     *testing.T
	srv   *Server
	ctl   *control.Control
	dir   string
	clock *fakeClock
	http  http.Handler
	logs  *bytes.Buffer
}

func newEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	return openEnv(t, dir)
}

func openEnv(t *testing.T, dir string, opts ...func(*Config)) *env {
	t.Helper()
	ctx := context.Background()
	st, err := control.OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	ctl, err := control.Open(ctx, st, control.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	logs := &bytes.Buffer{}
	cfg := Config{AdminToken: testAdmin, DataURL: dir, Now: clock.Now, Logger: slog.New(slog.NewJSONHandler(&syncWriter{w: logs}, nil)), MaxModuleBytes: 1 << 20}
	for _, o := range opts {
		o(&cfg)
	}
	srv, created, err := New(ctx, ctl, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if created != "" {
		t.Fatalf("a given admin token must not create another, got %q", created)
	}
	t.Cleanup(func() { srv.Close(ctx) })
	return &env{t: t, srv: srv, ctl: ctl, dir: dir, clock: clock, http: srv.Handler(), logs: logs}
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

type resp struct {
	code int
	hdr  http.Header
	body []byte
}

func (r resp) problem(t *testing.T) Problem {
	t.Helper()
	var p Problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("answer %d is not a problem: %v: %s", r.code, err, r.body)
	}
	if ct := r.hdr.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("problem Content-Type is %q", ct)
	}
	if p.Status != r.code || p.Code == "" || p.Title == "" || !strings.HasPrefix(p.Type, "urn:clink:problem:") {
		t.Fatalf("incomplete problem for %d: %+v", r.code, p)
	}
	return p
}

func (r resp) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
}

func (e *env) do(method, path, token, ctype string, body []byte) resp {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req := httptest.NewRequest(method, path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	return e.serve(req)
}

func (e *env) serve(req *http.Request) resp {
	w := httptest.NewRecorder()
	e.http.ServeHTTP(w, req)
	return resp{code: w.Code, hdr: w.Header(), body: w.Body.Bytes()}
}

func (e *env) json(method, path, token string, v any) resp {
	e.t.Helper()
	var b []byte
	if v != nil {
		var err error
		if s, ok := v.(string); ok {
			b = []byte(s)
		} else if b, err = json.Marshal(v); err != nil {
			e.t.Fatal(err)
		}
	}
	return e.do(method, path, token, "application/json", b)
}

// tenant creates a tenant and returns its token.
func (e *env) tenant(name string, quotas map[string]any) string {
	e.t.Helper()
	body := map[string]any{"name": name}
	if quotas != nil {
		body["quotas"] = quotas
	}
	r := e.json("POST", "/api/v1/tenants", testAdmin, body)
	if r.code != 201 {
		e.t.Fatalf("create tenant %s: %d %s", name, r.code, r.body)
	}
	var out struct {
		Token string `json:"token"`
	}
	r.decode(e.t, &out)
	if !strings.HasPrefix(out.Token, tenantTokenPrefix) {
		e.t.Fatalf("token %q", out.Token)
	}
	return out.Token
}

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "abi", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (e *env) upload(token, query string, bin []byte) resp {
	e.t.Helper()
	return e.do("POST", "/api/v1/modules"+query, token, "application/wasm", bin)
}

func TestTenantLifecycle(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", map[string]any{"max_pipelines": 3, "allowed_lookup_hosts": []string{"geo.internal:8080"}})

	r := e.json("GET", "/api/v1/tenants/acme", tok, nil)
	if r.code != 200 {
		t.Fatalf("get own tenant: %d %s", r.code, r.body)
	}
	var v TenantView
	r.decode(t, &v)
	def := control.DefaultQuotas()
	if v.Quotas.MaxPipelines != 3 || v.Quotas.MaxSubtasks != def.MaxSubtasks || v.Quotas.GuestMemoryBytes != def.GuestMemoryBytes ||
		len(v.Quotas.AllowedLookupHosts) != 1 || v.Usage.Modules != 0 {
		t.Fatalf("quotas not defaulted where left out: %+v", v)
	}
	if !bytes.Contains(r.body, []byte(`"api_requests_per_second":50`)) {
		t.Fatalf("answer lacks the defaulted api quota: %s", r.body)
	}
	// The token is never shown again, and never stored in clear.
	if bytes.Contains(r.body, []byte(tok)) {
		t.Fatal("GET shows the token")
	}
	cat, err := os.ReadFile(filepath.Join(e.dir, control.CatalogObject))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(cat, []byte(tok)) || bytes.Contains(cat, []byte(testAdmin)) {
		t.Fatal("the catalog holds a token in clear")
	}

	// PATCH changes only the named quota, live.
	r = e.json("PATCH", "/api/v1/tenants/acme", testAdmin, map[string]any{"quotas": map[string]any{"max_subtasks": 40}})
	if r.code != 200 {
		t.Fatalf("patch: %d %s", r.code, r.body)
	}
	r.decode(t, &v)
	if v.Quotas.MaxSubtasks != 40 || v.Quotas.MaxPipelines != 3 {
		t.Fatalf("patch changed the wrong quotas: %+v", v.Quotas)
	}
	if got := e.ctl.Snapshot().Tenants["acme"].Quotas.MaxSubtasks; got != 40 {
		t.Fatalf("live quota is %d", got)
	}
	// A tenant cannot raise its own quotas.
	if r := e.json("PATCH", "/api/v1/tenants/acme", tok, map[string]any{"quotas": map[string]any{"max_subtasks": 1000}}); r.code != 403 {
		t.Fatalf("tenant patched its own quotas: %d", r.code)
	}
	// Duplicate name.
	if r := e.json("POST", "/api/v1/tenants", testAdmin, map[string]any{"name": "acme"}); r.code != 409 || r.problem(t).Field != "name" {
		t.Fatalf("duplicate tenant: %d %s", r.code, r.body)
	}
	// Invalid quota values name the field.
	r = e.json("POST", "/api/v1/tenants", testAdmin, map[string]any{"name": "b", "quotas": map[string]any{"max_pipelines": -1}})
	if p := r.problem(t); r.code != 400 || p.Field != "quotas.max_pipelines" {
		t.Fatalf("negative quota: %d %+v", r.code, p)
	}
	r = e.json("POST", "/api/v1/tenants", testAdmin, map[string]any{"name": "b", "quotas": map[string]any{"allowed_lookup_hosts": []string{"ok.example", "http://evil/"}}})
	if p := r.problem(t); r.code != 400 || p.Field != "quotas.allowed_lookup_hosts[1]" {
		t.Fatalf("bad host: %d %+v", r.code, p)
	}

	// Token rotation: the old token stops working.
	r = e.json("POST", "/api/v1/tenants/acme/token", testAdmin, nil)
	var rot struct {
		Token string `json:"token"`
	}
	r.decode(t, &rot)
	if r.code != 200 || rot.Token == "" || rot.Token == tok {
		t.Fatalf("rotate: %d %s", r.code, r.body)
	}
	if r := e.json("GET", "/api/v1/tenants/acme", tok, nil); r.code != 401 {
		t.Fatalf("old token still works: %d", r.code)
	}
	if r := e.json("GET", "/api/v1/tenants/acme", rot.Token, nil); r.code != 200 {
		t.Fatalf("new token refused: %d", r.code)
	}
}

func TestListTenantsPaginates(t *testing.T) {
	e := newEnv(t)
	for _, n := range []string{"c", "a", "b", "d"} {
		e.tenant(n, nil)
	}
	var names []string
	after := ""
	for range 10 {
		r := e.json("GET", "/api/v1/tenants?limit=3&after="+after, testAdmin, nil)
		var pg struct {
			Items []TenantView `json:"items"`
			Next  string       `json:"next"`
		}
		r.decode(t, &pg)
		for _, it := range pg.Items {
			names = append(names, it.Name)
		}
		if pg.Next == "" {
			break
		}
		after = pg.Next
	}
	if strings.Join(names, ",") != "a,b,c,d" {
		t.Fatalf("pages gave %v", names)
	}
	if r := e.json("GET", "/api/v1/tenants?limit=0", testAdmin, nil); r.code != 400 || r.problem(t).Field != "limit" {
		t.Fatalf("limit=0: %d", r.code)
	}
}

func TestModuleRegistry(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", nil)
	counter := fixture(t, "counter.wasm")

	r := e.upload(tok, "?name=counter", counter)
	if r.code != 201 {
		t.Fatalf("upload: %d %s", r.code, r.body)
	}
	var m ModuleView
	r.decode(t, &m)
	if len(m.ID) != 64 || m.Name != "counter" || m.Version != "1" || m.Manifest.ABI != 1 || len(m.Manifest.States) != 1 || m.Size != int64(len(counter)) {
		t.Fatalf("module view: %+v", m)
	}
	// Same bytes again: the same record, not a new version.
	r = e.upload(tok, "?name=counter", counter)
	var again ModuleView
	r.decode(t, &again)
	if r.code != 200 || again.ID != m.ID || again.Version != "1" {
		t.Fatalf("re-upload: %d %+v", r.code, again)
	}
	// Other bytes under the same name get the next version.
	fast := fixture(t, "fast.wasm")
	r = e.upload(tok, "?name=counter", fast)
	var v2 ModuleView
	r.decode(t, &v2)
	if r.code != 201 || v2.Version != "2" || v2.ID == m.ID {
		t.Fatalf("second version: %d %s", r.code, r.body)
	}
	// An explicit version that exists with other bytes is a conflict.
	if r := e.upload(tok, "?name=counter&version=1", fixture(t, "garbage.wasm")); r.code != 409 || r.problem(t).Field != "version" {
		t.Fatalf("version clash: %d %s", r.code, r.body)
	}
	// Resolve by id, NAME@VERSION and NAME (latest).
	for ref, want := range map[string]string{m.ID: m.ID, "counter@1": m.ID, "counter@2": v2.ID, "counter": v2.ID, "sha256:" + m.ID: m.ID} {
		r := e.json("GET", "/api/v1/modules/"+ref, tok, nil)
		var got ModuleView
		r.decode(t, &got)
		if r.code != 200 || got.ID != want {
			t.Fatalf("GET %s: %d %s", ref, r.code, r.body)
		}
	}
	// The blob is content-addressed in the store.
	b, err := os.ReadFile(filepath.Join(e.dir, "modules", "sha256", m.ID+".wasm"))
	if err != nil || !bytes.Equal(b, counter) {
		t.Fatalf("blob: %v", err)
	}
	// List.
	r = e.json("GET", "/api/v1/modules", tok, nil)
	var pg struct {
		Items []ModuleView `json:"items"`
	}
	r.decode(t, &pg)
	if len(pg.Items) != 2 || pg.Items[0].Version != "1" || pg.Items[1].Version != "2" {
		t.Fatalf("list: %s", r.body)
	}
	// Delete v1; its blob goes.
	if r := e.json("DELETE", "/api/v1/modules/counter@1", tok, nil); r.code != 204 {
		t.Fatalf("delete: %d %s", r.code, r.body)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "modules", "sha256", m.ID+".wasm")); !os.IsNotExist(err) {
		t.Fatalf("blob still there: %v", err)
	}
	if r := e.json("GET", "/api/v1/modules/"+m.ID, tok, nil); r.code != 404 {
		t.Fatalf("deleted module: %d", r.code)
	}
}

func TestModuleDefaultsToManifestName(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", nil)
	r := e.upload(tok, "", fixture(t, "counter.wasm"))
	var m ModuleView
	r.decode(t, &m)
	if r.code != 201 || m.Name != m.Manifest.Name || m.Name == "" {
		t.Fatalf("%d %s", r.code, r.body)
	}
}

func TestInvalidModuleListsEveryProblem(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", nil)
	r := e.upload(tok, "?name=broken", fixture(t, "noexports.wasm"))
	p := r.problem(t)
	if r.code != 422 || p.Code != CodeModuleInvalid || len(p.Problems) != 3 {
		t.Fatalf("%d %s", r.code, r.body)
	}
	for _, want := range []string{`missing export "memory"`, "missing export clink_input", "missing export clink_process"} {
		found := false
		for _, pr := range p.Problems {
			found = found || (pr.Source == "abi" && strings.Contains(pr.Detail, want))
		}
		if !found {
			t.Errorf("no problem mentions %q: %+v", want, p.Problems)
		}
	}
	// Not a module at all.
	r = e.upload(tok, "?name=broken", []byte("hello, not wasm"))
	if p := r.problem(t); r.code != 422 || len(p.Problems) != 1 || !strings.Contains(p.Problems[0].Detail, "not a WebAssembly module") {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if n := len(e.ctl.Snapshot().Modules); n != 0 {
		t.Fatalf("%d modules registered", n)
	}
	// Wrong media type.
	if r := e.do("POST", "/api/v1/modules", tok, "application/octet-stream", fixture(t, "counter.wasm")); r.code != 415 || r.problem(t).Field != "Content-Type" {
		t.Fatalf("media type: %d", r.code)
	}
}

func TestModuleBeyondTenantLimits(t *testing.T) {
	e := newEnv(t)
	// enrich.wasm needs 4 pages (256 KiB) and declares endpoint "svc".
	tok := e.tenant("small", map[string]any{"guest_memory_bytes": 128 << 10})
	r := e.upload(tok, "?name=enrich", fixture(t, "enrich.wasm"))
	p := r.problem(t)
	if r.code != 422 || len(p.Problems) != 2 {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if !strings.Contains(p.Problems[0].Detail, "guest_memory_bytes") || !strings.Contains(p.Problems[1].Detail, "allowed_lookup_hosts") || p.Problems[0].Source != "quota" {
		t.Fatalf("problems: %+v", p.Problems)
	}
	// With room and an allowed host it registers.
	e.json("PATCH", "/api/v1/tenants/small", testAdmin, map[string]any{"quotas": map[string]any{"guest_memory_bytes": 1 << 20, "allowed_lookup_hosts": []string{"svc.internal"}}})
	if r := e.upload(tok, "?name=enrich", fixture(t, "enrich.wasm")); r.code != 201 {
		t.Fatalf("after raising the quotas: %d %s", r.code, r.body)
	}
	// A tenant without state quota cannot register a stateful module.
	tok2 := e.tenant("nostate", map[string]any{"state_bytes": 0})
	r = e.upload(tok2, "", fixture(t, "counter.wasm"))
	if p := r.problem(t); r.code != 422 || len(p.Problems) != 1 || !strings.Contains(p.Problems[0].Detail, "state_bytes") {
		t.Fatalf("%d %s", r.code, r.body)
	}
	// max_modules.
	tok3 := e.tenant("one", map[string]any{"max_modules": 1})
	e.upload(tok3, "", fixture(t, "counter.wasm"))
	if r := e.upload(tok3, "", fixture(t, "fast.wasm")); r.code != 422 || r.problem(t).Code != CodeQuotaExceeded {
		t.Fatalf("max_modules: %d %s", r.code, r.body)
	}
}

func TestOversizedUpload(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", map[string]any{"max_module_bytes": 1000})
	big := append(fixture(t, "counter.wasm"), make([]byte, 2000)...)
	r := e.upload(tok, "", big)
	if p := r.problem(t); r.code != 413 || p.Code != CodeTooLarge {
		t.Fatalf("%d %s", r.code, r.body)
	}
	// Without a Content-Length the limit holds too.
	req := httptest.NewRequest("POST", "/api/v1/modules", io.MultiReader(bytes.NewReader(big)))
	req.ContentLength = -1
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/wasm")
	w := httptest.NewRecorder()
	e.http.ServeHTTP(w, req)
	if w.Code != 413 {
		t.Fatalf("chunked: %d", w.Code)
	}
	// The server-wide cap (1 MiB here) applies above a larger tenant quota.
	e.json("PATCH", "/api/v1/tenants/acme", testAdmin, map[string]any{"quotas": map[string]any{"max_module_bytes": 1 << 30}})
	if r := e.upload(tok, "", make([]byte, 1<<20+1)); r.code != 413 {
		t.Fatalf("server cap: %d", r.code)
	}
}

func TestMalformedJSONNamesTheField(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		body, field, code string
	}{
		{`{"name": "x", `, "body", CodeMalformedJSON},
		{`{"name": 12}`, "name", CodeMalformedJSON},
		{`{"name": "x", "quotas": {"max_pipelines": "ten"}}`, "quotas.max_pipelines", CodeMalformedJSON},
		{`{"name": "x", "quota": {}}`, "quota", CodeInvalidField},
		{``, "body", CodeMalformedJSON},
		{`{"name": "x"} {"name": "y"}`, "body", CodeMalformedJSON},
		{`{"name": "../etc"}`, "name", CodeInvalidField},
		{`{}`, "name", CodeInvalidField},
	}
	for _, c := range cases {
		r := e.json("POST", "/api/v1/tenants", testAdmin, c.body)
		p := r.problem(t)
		if r.code != 400 || p.Field != c.field || p.Code != c.code {
			t.Errorf("%s: %d field %q code %q (%s), want field %q code %q", c.body, r.code, p.Field, p.Code, p.Detail, c.field, c.code)
		}
	}
	tok := e.tenant("acme", nil)
	r := e.json("POST", "/api/v1/pipelines", tok, `{"name": "p", "spec": {"operators": [{"module": "m", "parallelism": "two"}]}}`)
	if p := r.problem(t); r.code != 400 || p.Field != "spec.operators.parallelism" {
		t.Errorf("spec type error: %d %+v", r.code, p)
	}
	if r := e.do("POST", "/api/v1/tenants", testAdmin, "text/plain", []byte(`{"name":"x"}`)); r.code != 415 {
		t.Errorf("text/plain JSON: %d", r.code)
	}
}

func TestPathTraversal(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", nil)
	// Put a file outside the store that a traversal would reach.
	secret := filepath.Join(filepath.Dir(e.dir), "secret.wasm")
	os.WriteFile(secret, []byte("TOPSECRET-CONTENT-42"), 0o600)
	paths := []string{
		"/api/v1/modules/..%2F..%2Fsecret", "/api/v1/modules/..", "/api/v1/modules/%2e%2e",
		"/api/v1/modules/sha256:..%2f..%2fsecret", "/api/v1/modules/a%00b",
		"/api/v1/pipelines/..%2Fcatalog.json", "/api/v1/tenants/..%2F..", "/api/v1/tenants/acme%2F..",
		"/assets/..%2F..%2Fetc%2Fpasswd", "/assets/../server.go",
	}
	for _, p := range paths {
		r := e.json("GET", p, tok, nil)
		if r.code != 400 && r.code != 404 && r.code != 403 {
			t.Errorf("GET %s: %d %s", p, r.code, r.body)
		}
		if bytes.Contains(r.body, []byte("TOPSECRET")) {
			t.Errorf("GET %s leaked: %s", p, r.body)
		}
	}
	for _, q := range []string{"?name=..", "?name=../x", "?name=a/b", "?name=.hidden", "?version=..", "?version=1/../2", "?name=a..b"} {
		r := e.upload(tok, q, fixture(t, "counter.wasm"))
		if p := r.problem(t); r.code != 400 || (p.Field != "name" && p.Field != "version") {
			t.Errorf("upload %s: %d %s", q, r.code, r.body)
		}
	}
	// Nothing was written outside the store.
	entries, _ := os.ReadDir(e.dir)
	for _, en := range entries {
		if en.Name() != "catalog.json" && en.Name() != ".lock" && en.Name() != "modules" {
			t.Errorf("unexpected object %s", en.Name())
		}
	}
}

func TestRateLimit(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", map[string]any{"api_requests_per_second": 5})
	other := e.tenant("other", map[string]any{"api_requests_per_second": 5})
	for i := range 5 {
		if r := e.json("GET", "/api/v1/modules", tok, nil); r.code != 200 {
			t.Fatalf("request %d: %d", i, r.code)
		}
	}
	r := e.json("GET", "/api/v1/modules", tok, nil)
	p := r.problem(t)
	if r.code != 429 || p.Code != CodeRateLimited || r.hdr.Get("Retry-After") != "1" {
		t.Fatalf("6th request: %d %q %s", r.code, r.hdr.Get("Retry-After"), r.body)
	}
	// Another tenant is not slowed down, nor the admin.
	if r := e.json("GET", "/api/v1/modules", other, nil); r.code != 200 {
		t.Fatalf("other tenant: %d", r.code)
	}
	if r := e.json("GET", "/api/v1/tenants", testAdmin, nil); r.code != 200 {
		t.Fatalf("admin: %d", r.code)
	}
	// 200 ms later one token is back (5/s).
	e.clock.Advance(200 * time.Millisecond)
	if r := e.json("GET", "/api/v1/modules", tok, nil); r.code != 200 {
		t.Fatalf("after refill: %d", r.code)
	}
	if r := e.json("GET", "/api/v1/modules", tok, nil); r.code != 429 {
		t.Fatalf("only one token refilled: %d", r.code)
	}
	// A live quota change applies at once: a higher rate refills faster.
	e.json("PATCH", "/api/v1/tenants/acme", testAdmin, map[string]any{"quotas": map[string]any{"api_requests_per_second": 100}})
	e.clock.Advance(10 * time.Millisecond)
	if r := e.json("GET", "/api/v1/modules", tok, nil); r.code != 200 {
		t.Fatalf("after raising the rate: %d", r.code)
	}
	if !strings.Contains(readMetrics(t, e), `clink_tenant_api_rate_limited_total{tenant="acme"} 2`) {
		t.Fatal("rate-limited requests not counted")
	}
}

func TestLimiterRetryAfter(t *testing.T) {
	now := time.Unix(0, 0)
	l := newLimiter(func() time.Time { return now })
	for range 2 {
		if _, lim := l.take("t", 2); lim {
			t.Fatal("burst refused")
		}
	}
	wait, lim := l.take("t", 2)
	if !lim || wait != 500*time.Millisecond {
		t.Fatalf("wait %v limited %v", wait, lim)
	}
	now = now.Add(wait)
	if _, lim := l.take("t", 2); lim {
		t.Fatal("refused after the announced wait")
	}
	// The bucket never holds more than a burst.
	now = now.Add(time.Hour)
	for i := range 3 {
		_, lim := l.take("t", 2)
		if lim != (i == 2) {
			t.Fatalf("take %d limited=%v", i, lim)
		}
	}
}

func readMetrics(t *testing.T, e *env) string {
	t.Helper()
	r := e.do("GET", "/metrics", testAdmin, "", nil)
	if r.code != 200 {
		t.Fatalf("metrics: %d", r.code)
	}
	return string(r.body)
}

func TestMetricsAndLogs(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", nil)
	e.upload(tok, "", fixture(t, "counter.wasm"))
	e.json("GET", "/api/v1/modules/"+strings.Repeat("a", 64), tok, nil)
	e.json("GET", "/nope/"+strings.Repeat("x", 10), "", nil)
	m := readMetrics(t, e)
	for _, want := range []string{
		`clink_http_requests_total{code="201",method="POST",route="/api/v1/tenants"} 1`,
		`clink_http_requests_total{code="404",method="GET",route="/api/v1/modules/:id"} 1`,
		`clink_module_uploads_total{result="registered"} 1`,
		`clink_tenant_modules{tenant="acme"} 1`,
		`clink_tenants 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// Raw paths never become labels.
	if strings.Contains(m, "xxxxxxxxxx") || strings.Contains(m, strings.Repeat("a", 64)) {
		t.Error("a raw path is a label value")
	}
	for _, line := range strings.Split(m, "\n") {
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		if !strings.HasPrefix(line, "clink_") && !strings.HasPrefix(line, "go_") {
			t.Errorf("metric without the clink_ prefix: %s", line)
		}
	}
	// Tenants and admins cannot... a tenant token cannot read metrics (they hold other tenants' labels).
	if r := e.do("GET", "/metrics", tok, "", nil); r.code != 403 {
		t.Errorf("tenant read /metrics: %d", r.code)
	}
	// Logs are JSON lines with the route template and principal, and never a token.
	logs := e.logs.String()
	if strings.Contains(logs, tok) || strings.Contains(logs, testAdmin) {
		t.Fatal("a token is in the log")
	}
	var sawUpload bool
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %s", line)
		}
		if rec["msg"] == "request" && rec["route"] == "/api/v1/modules" && rec["tenant"] == "acme" && rec["status"] == float64(201) {
			sawUpload = true
		}
	}
	if !sawUpload {
		t.Fatalf("no request log for the upload:\n%s", logs)
	}
}

func TestHealthAndUnknownRoutes(t *testing.T) {
	e := newEnv(t)
	for _, p := range []string{"/healthz", "/readyz"} {
		if r := e.do("GET", p, "", "", nil); r.code != 200 {
			t.Errorf("%s: %d", p, r.code)
		}
	}
	r := e.do("GET", "/api/v1/nothing", testAdmin, "", nil)
	if p := r.problem(t); r.code != 404 || p.Code != CodeNotFound {
		t.Errorf("unknown route: %d %s", r.code, r.body)
	}
	r = e.do("PUT", "/api/v1/tenants", testAdmin, "", nil)
	if p := r.problem(t); r.code != 405 || p.Code != CodeMethodNotAllowed {
		t.Errorf("wrong method: %d %s", r.code, r.body)
	}
}

func TestRestartKeepsRecords(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", map[string]any{"max_pipelines": 7})
	r := e.upload(tok, "?name=counter", fixture(t, "counter.wasm"))
	var m ModuleView
	r.decode(t, &m)
	r = e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": "p1", "spec": hosted(map[string]any{"operators": []any{map[string]any{"module": "counter"}}})})
	if r.code != 201 {
		t.Fatalf("pipeline: %d %s", r.code, r.body)
	}
	var pl PipelineView
	r.decode(t, &pl)
	if err := e.ctl.SetCheckpoint(context.Background(), pl.ID, control.CheckpointPointer{ID: 3, URL: "file:///x"}); err != nil {
		t.Fatal(err)
	}

	e2 := openEnv(t, e.dir)
	if r := e2.json("GET", "/api/v1/tenants/acme", tok, nil); r.code != 200 || !bytes.Contains(r.body, []byte(`"max_pipelines":7`)) {
		t.Fatalf("tenant after restart: %d %s", r.code, r.body)
	}
	if r := e2.json("GET", "/api/v1/modules/"+m.ID, tok, nil); r.code != 200 {
		t.Fatalf("module after restart: %d", r.code)
	}
	r = e2.json("GET", "/api/v1/pipelines/"+pl.ID+"/checkpoints", tok, nil)
	if r.code != 200 || !bytes.Contains(r.body, []byte(`"id":3`)) {
		t.Fatalf("checkpoint pointer after restart: %d %s", r.code, r.body)
	}
}

func TestConsoleFiles(t *testing.T) {
	e := newEnv(t)
	e.srv.cfg.Console = fstest.MapFS{
		"index.html":    {Data: []byte("<!doctype html><title>console</title>")},
		"assets/app.js": {Data: []byte("console.log(1)")},
	}
	r := e.do("GET", "/", "", "", nil)
	if r.code != 200 || !strings.HasPrefix(r.hdr.Get("Content-Type"), "text/html") || !bytes.Contains(r.body, []byte("console")) {
		t.Fatalf("index: %d %q", r.code, r.hdr.Get("Content-Type"))
	}
	if csp := r.hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Fatalf("CSP %q", csp)
	}
	if r := e.do("GET", "/assets/app.js", "", "", nil); r.code != 200 || !strings.Contains(r.hdr.Get("Content-Type"), "javascript") {
		t.Fatalf("asset: %d %q", r.code, r.hdr.Get("Content-Type"))
	}
	for _, p := range []string{"/assets/missing.js", "/assets/..%2Findex.html", "/assets/", "/assets/a%5Cb"} {
		if r := e.do("GET", p, "", "", nil); r.code != 404 {
			t.Errorf("%s: %d", p, r.code)
		}
	}
}

func TestPipelineRecords(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", map[string]any{"max_pipelines": 2, "max_subtasks": 9, "allowed_lookup_hosts": []string{"svc.internal", "hooks.internal"},
		"guest_memory_bytes": 1 << 20, "max_in_flight_records": 100, "cpu_time_per_record_ms": 50})
	e.upload(tok, "?name=counter", fixture(t, "counter.wasm"))
	if r := e.upload(tok, "?name=enrich", fixture(t, "enrich.wasm")); r.code != 201 {
		t.Fatalf("enrich: %d %s", r.code, r.body)
	}
	spec := func(ops ...map[string]any) map[string]any {
		return hosted(map[string]any{"operators": ops, "sources": []any{map[string]any{"name": "in", "type": "generator"}}})
	}
	op := func(module string, par int) map[string]any {
		return map[string]any{"name": "op", "module": module, "parallelism": par, "key": "user"}
	}
	with := func(m map[string]any, k string, v any) map[string]any {
		out := map[string]any{}
		for a, b := range m {
			out[a] = b
		}
		out[k] = v
		return out
	}
	svc := []any{map[string]any{"name": "svc", "base_url": "http://svc.internal:8080/v1"}}

	r := e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": "p1", "spec": spec(op("counter", 3))})
	if r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	var p PipelineView
	r.decode(t, &p)
	// Subtasks count the source's one, the operator's three and the sink's one.
	if p.State != "created" || p.Subtasks != 5 || p.Revision != 1 || len(p.Modules) != 1 || !bytes.Contains(p.Spec, []byte(`"type":"generator"`)) {
		t.Fatalf("record: %+v %s", p, p.Spec)
	}
	// The module is in use now.
	if r := e.json("DELETE", "/api/v1/modules/counter", tok, nil); r.code != 409 || r.problem(t).Code != CodeInUse || !strings.Contains(r.problem(t).Detail, p.ID) {
		t.Fatalf("delete in use: %d %s", r.code, r.body)
	}
	// Quotas: subtasks summed over pipelines.
	r = e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": "p2", "spec": spec(op("counter", 3))})
	if pr := r.problem(t); r.code != 422 || pr.Field != "quotas.max_subtasks" {
		t.Fatalf("subtasks: %d %s", r.code, r.body)
	}
	// Each refusal names the field at fault.
	for _, c := range []struct {
		spec  any
		field string
	}{
		{spec(op("nosuch", 1)), "spec.operators[0].module"},
		{spec(op("counter", 0)), "spec.operators[0].parallelism"},
		{map[string]any{"sources": []any{}}, "spec.operators"},
		{[]any{1}, "spec"},
		{with(spec(op("counter", 1)), "tenant", "other"), "spec.tenant"},
		{with(spec(op("counter", 1)), "state", map[string]any{"url": "file:///etc"}), "spec.state.url"},
		{with(spec(op("counter", 1)), "sources", []any{map[string]any{"type": "file", "path": "/etc/passwd"}}), "spec.sources[0].type"},
		{with(spec(op("counter", 1)), "sinks", []any{map[string]any{"type": "file", "path": "/tmp/x"}}), "spec.sinks[0].type"},
		{with(spec(op("counter", 1)), "sinks", []any{map[string]any{"type": "stdout"}}), "spec.sinks[0].type"},
		{with(spec(op("counter", 1)), "sinks", []any{map[string]any{"type": "webhook", "url": "http://evil.example/hook"}}), "spec.sinks[0].url"},
		{with(spec(op("counter", 1)), "sinks", []any{map[string]any{"type": "webhook", "options": map[string]any{"url": "http://evil.example/"}}}), "spec.sinks[0].options.url"},
		// enrich declares endpoint "svc": its operator must define it, on an allowed host.
		{spec(op("enrich", 1)), "spec.operators[0].endpoints"},
		{spec(with(op("enrich", 1), "endpoints", []any{map[string]any{"name": "svc", "base_url": "http://evil.example/"}})), "spec.operators[0].endpoints[0].base_url"},
		{spec(with(op("enrich", 1), "endpoints", []any{map[string]any{"name": "svc", "base_url": "ftp://svc.internal/"}})), "spec.operators[0].endpoints[0].base_url"},
		{spec(with(op("counter", 1), "limits", map[string]any{"memory_pages": 17})), "spec.operators[0].limits.memory_pages"},
		{spec(with(op("counter", 1), "limits", map[string]any{"max_in_flight": 101})), "spec.operators[0].limits.max_in_flight"},
		{spec(with(op("counter", 1), "limits", map[string]any{"call_timeout": "51ms"})), "spec.operators[0].limits.call_timeout"},
		{spec(with(op("counter", 1), "limits", map[string]any{"call_timeout": "soon"})), "spec.operators[0].limits.call_timeout"},
		{with(spec(op("counter", 1)), "parallelism", 0), "spec.parallelism"},
		// The runtime's own validation (pipeline.ParseSpec), with its field paths.
		{spec(with(op("counter", 1), "paralelism", 2)), "spec.operators[0].paralelism"},
		{with(spec(op("counter", 1)), "sinks", []any{map[string]any{"name": "out", "type": "preview", "inputs": []any{"nosuch"}}}), "spec.sinks[0].inputs[0]"},
		{with(spec(op("counter", 1)), "sources", []any{map[string]any{"name": "in", "type": "http", "parallelism": 2}}), "spec.sources[0].parallelism"},
		{with(spec(op("counter", 1)), "sources", []any{map[string]any{"name": "in", "type": "generator", "kind": "nosuch"}}), "spec.sources[0].kind"},
	} {
		r := e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": "px", "spec": c.spec})
		if pr := r.problem(t); pr.Field != c.field || (r.code != 400 && r.code != 422) {
			t.Errorf("spec %v: %d field %q (%s), want %q", c.spec, r.code, pr.Field, pr.Detail, c.field)
		}
	}
	ok := map[string]any{"operators": []any{with(with(op("enrich", 1), "endpoints", svc), "limits", map[string]any{"memory_pages": 16, "max_in_flight": 100, "call_timeout": "50ms"})},
		"sinks": []any{map[string]any{"name": "out", "type": "webhook", "url": "https://hooks.internal/in", "inputs": []any{"op"}}}}
	r = e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": "p2", "spec": hosted(ok)})
	if r.code != 201 {
		t.Fatalf("enrich pipeline: %d %s", r.code, r.body)
	}
	// max_pipelines.
	if r := e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": "p3", "spec": spec(op("counter", 1))}); r.code != 422 || r.problem(t).Field != "quotas.max_pipelines" {
		t.Fatalf("max_pipelines: %d %s", r.code, r.body)
	}
	// PATCH: a merge patch of the spec; the record's own subtasks do not count twice
	// (1 source + 4 + 1 sink here, 3 in p2: 9 of 9).
	r = e.json("PATCH", "/api/v1/pipelines/"+p.ID, tok, map[string]any{"spec": map[string]any{"operators": fillOps([]any{op("counter", 4)})}})
	if r.code != 200 {
		t.Fatalf("patch: %d %s", r.code, r.body)
	}
	r.decode(t, &p)
	if p.Subtasks != 6 || p.Revision != 2 || !bytes.Contains(p.Spec, []byte(`"sources"`)) {
		t.Fatalf("patched: %+v %s", p, p.Spec)
	}
	if r := e.json("PATCH", "/api/v1/pipelines/"+p.ID, tok, map[string]any{"spec": map[string]any{"operators": fillOps([]any{op("counter", 5)})}}); r.code != 422 {
		t.Fatalf("patch over quota: %d", r.code)
	}
	if r := e.json("PATCH", "/api/v1/pipelines/"+p.ID, tok, map[string]any{"name": "p2"}); r.code != 409 {
		t.Fatalf("rename onto another: %d", r.code)
	}
	// Run-time routes on a pipeline that is not running say so; rescale needs a body.
	for sub, want := range map[string]int{"stop": 409, "savepoints": 409, "records": 503, "rescale": 400} {
		r := e.json("POST", "/api/v1/pipelines/"+p.ID+"/"+sub, tok, nil)
		if pr := r.problem(t); r.code != want || (want == 503 && r.hdr.Get("Retry-After") == "") {
			t.Errorf("%s: %d %s %+v", sub, r.code, r.body, pr)
		}
	}
	// Delete: the module is free again.
	if r := e.json("DELETE", "/api/v1/pipelines/"+p.ID, tok, nil); r.code != 204 {
		t.Fatalf("delete: %d", r.code)
	}
	if r := e.json("GET", "/api/v1/pipelines/"+p.ID, tok, nil); r.code != 404 {
		t.Fatalf("deleted pipeline: %d", r.code)
	}
	if r := e.json("DELETE", "/api/v1/modules/counter", tok, nil); r.code != 204 {
		t.Fatalf("delete module after: %d %s", r.code, r.body)
	}
}

// TestConcurrentUploadsAndPipelines hammers one tenant from many goroutines (run under -race):
// every accepted pipeline counts against the quota exactly once.
func TestConcurrentUploadsAndPipelines(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", map[string]any{"max_pipelines": 5, "max_subtasks": 100, "api_requests_per_second": 100000})
	e.upload(tok, "?name=counter", fixture(t, "counter.wasm"))
	var wg sync.WaitGroup
	codes := make(chan int, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": "p" + strconv.Itoa(i), "spec": hosted(map[string]any{"operators": []any{map[string]any{"module": "counter"}}})})
			codes <- r.code
		}()
	}
	wg.Wait()
	close(codes)
	created := 0
	for c := range codes {
		switch c {
		case 201:
			created++
		case 422:
		default:
			t.Errorf("code %d", c)
		}
	}
	if created != 5 || len(e.ctl.Snapshot().TenantPipelines("acme")) != 5 {
		t.Fatalf("%d created, %d stored", created, len(e.ctl.Snapshot().TenantPipelines("acme")))
	}
}

// TestRestartKeepsRecordsS3 is the restart test over the s3:// store (versitygw on loopback,
// scripts/with-s3.sh); it fails under CI=true when no server is configured.
func TestRestartKeepsRecordsS3(t *testing.T) {
	ep := os.Getenv("CLINK_TEST_S3_ENDPOINT")
	if ep == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("S3 tests need CLINK_TEST_S3_ENDPOINT (scripts/with-s3.sh)")
		}
		t.Skip("S3 tests need CLINK_TEST_S3_ENDPOINT (scripts/with-s3.sh)")
	}
	if !strings.HasPrefix(ep, "http://127.0.0.1:") && !strings.HasPrefix(ep, "http://localhost:") {
		t.Fatalf("CLINK_TEST_S3_ENDPOINT must be loopback, got %q", ep)
	}
	ctx := context.Background()
	dataURL := "s3://" + os.Getenv("CLINK_TEST_S3_BUCKET") + "/server-test-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "?endpoint=" + ep + "&path_style=true"
	open := func() (*Server, *control.Control) {
		st, err := control.OpenStore(ctx, dataURL, control.S3Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctl, err := control.Open(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		srv, _, err := New(ctx, ctl, Config{AdminToken: testAdmin, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close(ctx) })
		return srv, ctl
	}
	srv, ctl := open()
	e := &env{t: t, srv: srv, ctl: ctl, http: srv.Handler(), logs: &bytes.Buffer{}}
	tok := e.tenant("acme", nil)
	r := e.upload(tok, "?name=counter", fixture(t, "counter.wasm"))
	if r.code != 201 {
		t.Fatalf("upload: %d %s", r.code, r.body)
	}
	srv2, ctl2 := open()
	e2 := &env{t: t, srv: srv2, ctl: ctl2, http: srv2.Handler(), logs: &bytes.Buffer{}}
	if r := e2.json("GET", "/api/v1/modules/counter@1", tok, nil); r.code != 200 {
		t.Fatalf("after restart: %d %s", r.code, r.body)
	}
	b, err := ctl2.Blob(ctx, e2.ctl.Snapshot().TenantModules("acme")[0].ID)
	if err != nil || !bytes.Equal(b, fixture(t, "counter.wasm")) {
		t.Fatalf("blob after restart: %v", err)
	}
}

func TestUpgradeKeepsState(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", nil)
	e.upload(tok, "?name=counter", fixture(t, "counter.wasm")) // states: count
	e.upload(tok, "?name=fast", fixture(t, "fast.wasm"))       // states: n, m
	e.upload(tok, "?name=plain", fixture(t, "garbage.wasm"))   // no state
	r := e.json("POST", "/api/v1/pipelines", tok, map[string]any{"name": "p", "spec": hosted(map[string]any{"operators": []any{map[string]any{"name": "agg", "module": "counter"}}})})
	var p PipelineView
	r.decode(t, &p)
	// Without a checkpoint there is no state to keep: any module will do.
	if r := e.json("PATCH", "/api/v1/pipelines/"+p.ID, tok, map[string]any{"spec": map[string]any{"operators": fillOps([]any{map[string]any{"name": "agg", "module": "fast"}})}}); r.code != 200 {
		t.Fatalf("before a checkpoint: %d %s", r.code, r.body)
	}
	e.json("PATCH", "/api/v1/pipelines/"+p.ID, tok, map[string]any{"spec": map[string]any{"operators": fillOps([]any{map[string]any{"name": "agg", "module": "counter"}})}})
	if err := e.ctl.SetCheckpoint(context.Background(), p.ID, control.CheckpointPointer{ID: 1, URL: "file:///s"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ops   []any
		field string
		why   string
	}{
		{[]any{map[string]any{"name": "agg", "module": "fast"}}, "spec.operators[0].module", "does not declare state count"},
		{[]any{map[string]any{"name": "agg", "module": "plain"}}, "spec.operators[0].module", "does not declare state count"},
		{[]any{map[string]any{"name": "other", "module": "counter"}}, "spec.operators[0]", "removes it"},
	} {
		r := e.json("PATCH", "/api/v1/pipelines/"+p.ID, tok, map[string]any{"spec": map[string]any{"operators": fillOps(c.ops)}})
		pr := r.problem(t)
		if r.code != 409 || pr.Code != CodeIncompatibleState || pr.Field != c.field || !strings.Contains(pr.Detail, c.why) {
			t.Errorf("%v: %d %+v", c.ops, r.code, pr)
		}
	}
	// The same states (new bytes, a new version) and an added operator are fine.
	if r := e.upload(tok, "?name=counter&version=2", append(fixture(t, "counter.wasm"), 0, 5, 3, 'p', 'a', 'd', 0)); r.code != 201 {
		t.Fatalf("counter v2: %d %s", r.code, r.body)
	} // a trailing custom section "pad"
	r = e.json("PATCH", "/api/v1/pipelines/"+p.ID, tok, map[string]any{"spec": map[string]any{"operators": fillOps([]any{
		map[string]any{"name": "agg", "module": "counter@2"}, map[string]any{"name": "more", "module": "fast"}}),
		"sinks": []any{map[string]any{"name": "out", "type": "preview", "inputs": []any{"agg", "more"}}}}})
	if r.code != 200 {
		t.Fatalf("compatible upgrade: %d %s", r.code, r.body)
	}
}

func TestHandlerPanicIsA500(t *testing.T) {
	e := newEnv(t)
	e.srv.echo.GET("/boom", func(echo.Context) error { panic("kaboom") })
	r := e.do("GET", "/boom", "", "", nil)
	if p := r.problem(t); r.code != 500 || p.Code != CodeInternal || strings.Contains(p.Detail, "kaboom") {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if !strings.Contains(e.logs.String(), "kaboom") || !strings.Contains(e.logs.String(), "handler panic") {
		t.Fatalf("panic not logged: %s", e.logs.String())
	}
	// The server still answers.
	if r := e.do("GET", "/healthz", "", "", nil); r.code != 200 {
		t.Fatalf("after the panic: %d", r.code)
	}
}

// hosted completes a test spec into one the runtime accepts: an http source "in" when there
// is no source, each operator named (op<i>) and reading "in" when it says nothing, and a
// preview sink "out" of the last operator when there is no sink.
func hosted(spec map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range spec {
		out[k] = v
	}
	if _, ok := out["sources"]; !ok {
		out["sources"] = []any{map[string]any{"name": "in", "type": "http"}}
	}
	ops, _ := out["operators"].([]any)
	if ms, ok := out["operators"].([]map[string]any); ok {
		for _, m := range ms {
			ops = append(ops, m)
		}
	}
	out["operators"] = fillOps(ops)
	if _, ok := out["sinks"]; !ok && len(ops) > 0 {
		last := out["operators"].([]any)[len(ops)-1].(map[string]any)
		out["sinks"] = []any{map[string]any{"name": "out", "type": "preview", "inputs": []any{last["name"]}}}
	}
	return out
}

// fillOps names each operator (op<i>) and gives it the input "in" where it has none.
func fillOps(ops []any) []any {
	res := make([]any, len(ops))
	for i, o := range ops {
		m := map[string]any{}
		for k, v := range o.(map[string]any) {
			m[k] = v
		}
		if _, ok := m["name"]; !ok {
			m["name"] = "op" + strconv.Itoa(i)
		}
		if _, ok := m["inputs"]; !ok {
			m["inputs"] = []any{"in"}
		}
		res[i] = m
	}
	return res
}
