package server

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/clink-wasm/clink-wasm/host/control"
)

// validTenantName: names that end up in URLs, object names and metric labels cannot traverse a
// path or break a label (control.ValidTenantName).
func validTenantName(field, n string) error {
	if !control.ValidTenantName(n) {
		return badField(field, "tenant name %q is invalid: use 1-63 lower-case letters, digits and '-', starting and ending with a letter or digit", n)
	}
	return nil
}

// TenantView is a tenant as the API shows it.
type TenantView struct {
	Name   string         `json:"name"`
	Quotas control.Quotas `json:"quotas"`
	Usage  Usage          `json:"usage"`
	// OverQuota lists the admission quotas the tenant's usage is above: a quota lowered below
	// what the tenant had is kept, not enforced by stopping or deleting anything (see "Quotas
	// lowered below usage" in quotas_live.go). Absent when the tenant is within every quota.
	OverQuota []QuotaExcess `json:"over_quota,omitempty"`
	CreatedAt time.Time     `json:"created_at"`
	UpdatedAt time.Time     `json:"updated_at"`
}

// Usage is what a tenant uses of its quotas, from the records the control plane holds.
type Usage struct {
	Pipelines   int   `json:"pipelines"`
	Subtasks    int   `json:"subtasks"`
	Modules     int   `json:"modules"`
	ModuleBytes int64 `json:"module_bytes"`
	// StateBytes is the tenant's durable state as last measured (see quotas_live.go); absent
	// before the first measurement.
	StateBytes *int64 `json:"state_bytes,omitempty"`
}

func usageOf(cat *control.Catalog, tenant string) Usage {
	var u Usage
	for _, m := range cat.TenantModules(tenant) {
		u.Modules++
		u.ModuleBytes += m.Size
	}
	for _, p := range cat.TenantPipelines(tenant) {
		u.Pipelines++
		u.Subtasks += p.Subtasks
	}
	return u
}

// QuotaExcess is one quota a tenant's usage is above.
type QuotaExcess struct {
	Quota string `json:"quota"` // the field of quotas, e.g. "max_subtasks"
	Used  int64  `json:"used"`
	Limit int64  `json:"limit"`
}

// overQuota lists the quotas u is above.
func overQuota(q control.Quotas, u Usage) []QuotaExcess {
	var out []QuotaExcess
	add := func(name string, used, limit int64) {
		if used > limit {
			out = append(out, QuotaExcess{Quota: name, Used: used, Limit: limit})
		}
	}
	add("max_pipelines", int64(u.Pipelines), int64(q.MaxPipelines))
	add("max_subtasks", int64(u.Subtasks), int64(q.MaxSubtasks))
	add("max_modules", int64(u.Modules), int64(q.MaxModules))
	if u.StateBytes != nil {
		add("state_bytes", *u.StateBytes, q.StateBytes)
	}
	return out
}

func viewTenant(cat *control.Catalog, t *control.Tenant) TenantView {
	u := usageOf(cat, t.Name)
	return TenantView{Name: t.Name, Quotas: t.Quotas, Usage: u, OverQuota: overQuota(t.Quotas, u), CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt}
}

// viewTenant is viewTenant with the tenant's measured durable state.
func (s *Server) viewTenant(cat *control.Catalog, t *control.Tenant) TenantView {
	v := viewTenant(cat, t)
	if s.rt != nil {
		if n, ok := s.rt.measuredState(t.Name); ok {
			v.Usage.StateBytes = &n
			v.OverQuota = overQuota(t.Quotas, v.Usage)
		}
	}
	return v
}

type tenantCreate struct {
	Name   string             `json:"name"`
	Quotas control.QuotaPatch `json:"quotas"`
}

type tenantCreated struct {
	TenantView
	Token string `json:"token"`
}

func (s *Server) createTenant(c echo.Context) error {
	var req tenantCreate
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	if req.Name == "" {
		return badField("name", "a tenant needs a name")
	}
	if err := validTenantName("name", req.Name); err != nil {
		return err
	}
	q := req.Quotas.Apply(control.DefaultQuotas())
	if err := q.Validate("quotas."); err != nil {
		return fieldProblem(err)
	}
	tok := NewToken(tenantTokenPrefix)
	now := s.ctl.Now()
	var view TenantView
	err := s.ctl.Update(c.Request().Context(), func(cat *control.Catalog) error {
		if _, ok := cat.Tenants[req.Name]; ok {
			return problem(http.StatusConflict, CodeConflict, "name", "tenant %q exists already", req.Name)
		}
		t := &control.Tenant{Name: req.Name, Quotas: q, TokenHash: HashToken(tok), CreatedAt: now, UpdatedAt: now}
		cat.Tenants[t.Name] = t
		view = s.viewTenant(cat, t)
		return nil
	})
	if err != nil {
		return err
	}
	s.log.InfoContext(c.Request().Context(), "tenant created", "tenant", req.Name)
	return c.JSON(http.StatusCreated, tenantCreated{TenantView: view, Token: tok})
}

func (s *Server) rotateTenantToken(c echo.Context) error {
	name := c.Param("tenant")
	if err := validTenantName("tenant", name); err != nil {
		return err
	}
	tok := NewToken(tenantTokenPrefix)
	var view TenantView
	err := s.ctl.Update(c.Request().Context(), func(cat *control.Catalog) error {
		t, ok := cat.Tenants[name]
		if !ok {
			return notFound("tenant", name)
		}
		t.TokenHash = HashToken(tok)
		t.UpdatedAt = s.ctl.Now()
		view = s.viewTenant(cat, t)
		return nil
	})
	if err != nil {
		return err
	}
	s.log.InfoContext(c.Request().Context(), "tenant token replaced", "tenant", name)
	return c.JSON(http.StatusOK, tenantCreated{TenantView: view, Token: tok})
}

func (s *Server) listTenants(c echo.Context) error {
	cat := s.ctl.Snapshot()
	p := principalOf(c)
	var items []TenantView
	for _, t := range cat.Tenants {
		if p.admin || t.Name == p.tenant {
			items = append(items, s.viewTenant(cat, t))
		}
	}
	slices.SortFunc(items, func(a, b TenantView) int { return strings.Compare(a.Name, b.Name) })
	return page(c, items, func(t TenantView) string { return t.Name })
}

// tenantAllowed checks that the principal may see tenant name: the admin, or the tenant itself.
// The check comes before any lookup, so a refusal says nothing about whether name exists.
func tenantAllowed(c echo.Context, name string) error {
	p := principalOf(c)
	if !p.admin && p.tenant != name {
		return problem(http.StatusForbidden, CodeForbidden, "tenant", "a tenant token acts only for its own tenant")
	}
	return nil
}

func (s *Server) getTenant(c echo.Context) error {
	name := c.Param("tenant")
	if err := validTenantName("tenant", name); err != nil {
		return err
	}
	if err := tenantAllowed(c, name); err != nil {
		return err
	}
	cat := s.ctl.Snapshot()
	t, ok := cat.Tenants[name]
	if !ok {
		return notFound("tenant", name)
	}
	return c.JSON(http.StatusOK, s.viewTenant(cat, t))
}

type tenantPatch struct {
	Quotas *control.QuotaPatch `json:"quotas"`
}

func (s *Server) patchTenant(c echo.Context) error {
	name := c.Param("tenant")
	if err := validTenantName("tenant", name); err != nil {
		return err
	}
	var req tenantPatch
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	if req.Quotas == nil {
		return badField("quotas", "send {\"quotas\": {...}} with the quotas to change")
	}
	var view TenantView
	if s.rt != nil {
		s.rt.admitMu.Lock() // the CPU budget's check and this commit are one step (cpubudget.go)
		defer s.rt.admitMu.Unlock()
	}
	err := s.ctl.Update(c.Request().Context(), func(cat *control.Catalog) error {
		t, ok := cat.Tenants[name]
		if !ok {
			return notFound("tenant", name)
		}
		q := req.Quotas.Apply(t.Quotas)
		if err := q.Validate("quotas."); err != nil {
			return fieldProblem(err)
		}
		if s.rt != nil {
			if err := s.rt.checkCPUChange(cat, name, t.Quotas.GuestCPUMillicores, q.GuestCPUMillicores); err != nil {
				return err
			}
		}
		t.Quotas = q
		t.UpdatedAt = s.ctl.Now()
		view = s.viewTenant(cat, t)
		return nil
	})
	if err != nil {
		return err
	}
	s.log.InfoContext(c.Request().Context(), "tenant quotas changed", "tenant", name)
	for _, e := range view.OverQuota {
		s.log.WarnContext(c.Request().Context(), "tenant over a lowered quota: what runs keeps running, new admissions are refused",
			"tenant", name, "quota", e.Quota, "used", e.Used, "limit", e.Limit)
	}
	if t, ok := s.ctl.Snapshot().Tenants[name]; ok && s.rt != nil {
		s.rt.tenantQuotasChanged(t)
	}
	return c.JSON(http.StatusOK, view)
}

func fieldProblem(err error) error {
	var fe *control.FieldError
	if errors.As(err, &fe) {
		return badField(fe.Field, "%s", fe.Reason)
	}
	return err
}

// listPage is the shape of every list answer: a page of items and the cursor of the next.
type listPage[T any] struct {
	Items []T    `json:"items"`
	Next  string `json:"next,omitempty"`
}

// page answers one page of items, which are sorted by key; ?after=KEY continues a listing.
func page[T any](c echo.Context, items []T, key func(T) string) error {
	limit := 100
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return badField("limit", "limit must be an integer from 1 to 1000, got %q", v)
		}
		limit = n
	}
	if after := c.QueryParam("after"); after != "" {
		i, _ := slices.BinarySearchFunc(items, after, func(t T, k string) int { return strings.Compare(key(t), k) })
		for i < len(items) && key(items[i]) <= after {
			i++
		}
		items = items[i:]
	}
	out := listPage[T]{Items: items}
	if len(items) > limit {
		out.Items = items[:limit]
		out.Next = key(items[limit-1])
	}
	if out.Items == nil {
		out.Items = []T{}
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 5*time.Second)
	defer cancel()
	if _, _, err := s.ctl.Store().Get(ctx, control.CatalogObject); err != nil && !errors.Is(err, control.ErrNotFound) {
		return problem(http.StatusServiceUnavailable, CodeUnavailable, "", "the control plane's store does not answer: %v", err)
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
}
