package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/control"
)

var (
	// Module names follow the manifest's operator-name rule without dots at the ends, so that
	// "..", "." and "/" can never appear as a path segment.
	moduleNameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9_.-]{0,62}[A-Za-z0-9])?$`)
	versionRE    = regexp.MustCompile(`^[0-9A-Za-z]([0-9A-Za-z.+_-]{0,62}[0-9A-Za-z])?$`)
	moduleIDRE   = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

func validModuleName(field, n string) error {
	if !moduleNameRE.MatchString(n) || strings.Contains(n, "..") {
		return badField(field, "module name %q is invalid: use 1-64 characters of [A-Za-z0-9_.-], starting and ending with a letter or digit, without \"..\"", n)
	}
	return nil
}

func validVersion(field, v string) error {
	if !versionRE.MatchString(v) || strings.Contains(v, "..") {
		return badField(field, "version %q is invalid: use 1-64 characters of [0-9A-Za-z.+_-], starting and ending with a letter or digit, without \"..\"", v)
	}
	return nil
}

// ModuleView is a module as the API shows it.
type ModuleView struct {
	ID        string       `json:"id"`
	Name      string       `json:"name"`
	Version   string       `json:"version"`
	Ref       string       `json:"ref"` // NAME@VERSION
	Tenant    string       `json:"tenant"`
	Size      int64        `json:"size"`
	Manifest  abi.Manifest `json:"manifest"`
	Memory    string       `json:"memory,omitempty"`
	CreatedAt string       `json:"created_at"`
	UsedBy    []string     `json:"used_by"` // pipeline ids
}

func viewModule(cat *control.Catalog, m *control.Module) ModuleView {
	v := ModuleView{ID: m.ID, Name: m.Name, Version: m.Version, Ref: m.Name + "@" + m.Version, Tenant: m.Tenant, Size: m.Size,
		Manifest: m.Manifest, Memory: m.Memory, CreatedAt: m.CreatedAt.Format("2006-01-02T15:04:05Z07:00"), UsedBy: usersOf(cat, m)}
	return v
}

func usersOf(cat *control.Catalog, m *control.Module) []string {
	users := []string{}
	for _, p := range cat.TenantPipelines(m.Tenant) {
		if slices.Contains(p.Modules, m.ID) {
			users = append(users, p.ID)
		}
	}
	slices.Sort(users)
	return users
}

// resolveModule finds tenant's module by id, NAME@VERSION, or NAME (its latest version).
func resolveModule(cat *control.Catalog, tenant, ref, field string) (*control.Module, error) {
	if moduleIDRE.MatchString(ref) {
		if m, ok := cat.Modules[control.ModuleKey(tenant, ref)]; ok {
			return m, nil
		}
		return nil, notFound("module", ref)
	}
	name, version, hasVersion := strings.Cut(strings.TrimPrefix(ref, "sha256:"), "@")
	if strings.HasPrefix(ref, "sha256:") {
		if !moduleIDRE.MatchString(name) {
			return nil, badField(field, "%q is not a sha256 module id (64 lower-case hex digits)", ref)
		}
		return resolveModule(cat, tenant, name, field)
	}
	if err := validModuleName(field, name); err != nil {
		return nil, err
	}
	if hasVersion {
		if err := validVersion(field, version); err != nil {
			return nil, err
		}
	}
	var best *control.Module
	for _, m := range cat.TenantModules(tenant) {
		if m.Name != name {
			continue
		}
		if hasVersion {
			if m.Version == version {
				return m, nil
			}
			continue
		}
		if best == nil || m.CreatedAt.After(best.CreatedAt) || (m.CreatedAt.Equal(best.CreatedAt) && versionLess(best.Version, m.Version)) {
			best = m
		}
	}
	if best == nil {
		return nil, notFound("module", ref)
	}
	return best, nil
}

// versionLess orders versions numerically when both are integers, else as strings.
func versionLess(a, b string) bool {
	x, errA := strconv.Atoi(a)
	y, errB := strconv.Atoi(b)
	if errA == nil && errB == nil {
		return x < y
	}
	return a < b
}

func (s *Server) uploadModule(c echo.Context) error {
	tenant, err := s.tenantFor(c)
	if err != nil {
		return err
	}
	name, version := c.QueryParam("name"), c.QueryParam("version")
	if name != "" {
		if err := validModuleName("name", name); err != nil {
			return err
		}
	}
	if version != "" {
		if err := validVersion("version", version); err != nil {
			return err
		}
	}
	r := c.Request()
	if mt, _, err := mime.ParseMediaType(r.Header.Get(echo.HeaderContentType)); err != nil || mt != "application/wasm" {
		return problem(http.StatusUnsupportedMediaType, CodeUnsupportedMedia, "Content-Type", "send the module as Content-Type: application/wasm (got %q)", r.Header.Get(echo.HeaderContentType))
	}
	t, ok := s.ctl.Snapshot().Tenants[tenant]
	if !ok {
		return notFound("tenant", tenant)
	}
	limit := min(s.cfg.MaxModuleBytes, t.Quotas.MaxModuleBytes)
	tooLarge := func() error {
		s.metrics.uploads.WithLabelValues("too_large").Inc()
		return problem(http.StatusRequestEntityTooLarge, CodeTooLarge, "body", "a module may be at most %d bytes for tenant %q", limit, tenant)
	}
	if r.ContentLength > limit {
		return tooLarge()
	}
	release, err := s.uploadSlot(r.Context(), tenant)
	if err != nil {
		return err
	}
	defer release()
	// A client that trickles its body must not hold a slot for long.
	_ = http.NewResponseController(c.Response().Writer).SetReadDeadline(time.Now().Add(uploadReadTimeout))
	bin, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return problem(http.StatusBadRequest, CodeInvalidField, "body", "reading the module: %v", err)
	}
	if int64(len(bin)) > limit {
		return tooLarge()
	}
	sum := sha256.Sum256(bin)
	id := hex.EncodeToString(sum[:])

	// Identical bytes registered before need no validation: content addressing makes the
	// upload idempotent.
	if m, ok := s.ctl.Snapshot().Modules[control.ModuleKey(tenant, id)]; ok && (name == "" || name == m.Name) && (version == "" || version == m.Version) {
		s.metrics.uploads.WithLabelValues("existing").Inc()
		return c.JSON(http.StatusOK, viewModule(s.ctl.Snapshot(), m))
	}

	rep := s.engine.Inspect(r.Context(), bin)
	problems := make([]ModuleProblem, 0, len(rep.Problems))
	for _, p := range rep.Problems {
		problems = append(problems, ModuleProblem{Source: "abi", Detail: p})
	}
	problems = append(problems, quotaProblems(rep, t.Quotas)...)
	if len(problems) > 0 {
		s.metrics.uploads.WithLabelValues("invalid").Inc()
		p := problem(http.StatusUnprocessableEntity, CodeModuleInvalid, "body", "the module cannot be registered: %d problem%s", len(problems), plural(len(problems)))
		p.Problems = problems
		return p
	}
	if name == "" {
		name = rep.Manifest.Name
		if err := validModuleName("name", name); err != nil {
			return err
		}
	}
	if err := s.ctl.PutBlob(r.Context(), id, bin); err != nil {
		return fmt.Errorf("storing module %s: %w", id, err)
	}
	var view ModuleView
	status := http.StatusCreated
	err = s.ctl.Update(r.Context(), func(cat *control.Catalog) error {
		t, ok := cat.Tenants[tenant]
		if !ok {
			return notFound("tenant", tenant)
		}
		if m, ok := cat.Modules[control.ModuleKey(tenant, id)]; ok {
			if m.Name != name || (version != "" && m.Version != version) {
				return problem(http.StatusConflict, CodeConflict, "name", "these bytes are registered already as %s@%s (module %s)", m.Name, m.Version, id)
			}
			status = http.StatusOK
			view = viewModule(cat, m)
			return nil
		}
		mods := cat.TenantModules(tenant)
		if len(mods) >= t.Quotas.MaxModules {
			return problem(http.StatusUnprocessableEntity, CodeQuotaExceeded, "quotas.max_modules", "tenant %q has %d modules, its quota; delete one first", tenant, len(mods))
		}
		v := version
		if v == "" {
			next := 1
			for _, m := range mods {
				if n, err := strconv.Atoi(m.Version); err == nil && m.Name == name && n >= next {
					next = n + 1
				}
			}
			v = strconv.Itoa(next)
		}
		for _, m := range mods {
			if m.Name == name && m.Version == v {
				return problem(http.StatusConflict, CodeConflict, "version", "%s@%s exists already with other bytes (module %s); upload under a new version", name, v, m.ID)
			}
		}
		m := &control.Module{ID: id, Tenant: tenant, Name: name, Version: v, Size: int64(len(bin)), Manifest: *rep.Manifest, Memory: rep.Memory, CreatedAt: s.ctl.Now()}
		cat.Modules[control.ModuleKey(tenant, id)] = m
		view = viewModule(cat, m)
		return nil
	})
	if err != nil {
		return err
	}
	if status == http.StatusCreated {
		s.metrics.uploads.WithLabelValues("registered").Inc()
		s.log.InfoContext(r.Context(), "module registered", "tenant", tenant, "module", view.Ref, "id", id, "bytes", len(bin))
	} else {
		s.metrics.uploads.WithLabelValues("existing").Inc()
	}
	c.Response().Header().Set(echo.HeaderLocation, "/api/v1/modules/"+id)
	return c.JSON(status, view)
}

const wasmPage = 64 << 10

// uploadReadTimeout bounds reading one module body.
const uploadReadTimeout = 2 * time.Minute

// uploadSlot admits one upload. At most ValidationConcurrency uploads hold a body in memory and
// compile at once, so upload memory is bounded by ValidationConcurrency × MaxModuleBytes; and a
// tenant holds at most one of those slots, so a tenant that uploads without pause cannot make
// another tenant's upload wait behind more than one of its own. Waiters hold only their
// connection, until their request ends.
func (s *Server) uploadSlot(ctx context.Context, tenant string) (release func(), err error) {
	s.uploadsMu.Lock()
	ch, ok := s.uploads[tenant]
	if !ok {
		ch = make(chan struct{}, 1)
		s.uploads[tenant] = ch // one per tenant: bounded by the tenants the admin created
	}
	s.uploadsMu.Unlock()
	gone := problem(http.StatusServiceUnavailable, CodeUnavailable, "", "the request ended while waiting for an upload slot")
	select {
	case ch <- struct{}{}:
	case <-ctx.Done():
		return nil, gone
	}
	select {
	case s.validate <- struct{}{}:
	case <-ctx.Done():
		<-ch
		return nil, gone
	}
	return func() { <-s.validate; <-ch }, nil
}

// quotaProblems checks what the module declares against what the tenant may use.
func quotaProblems(rep *abi.Report, q control.Quotas) []ModuleProblem {
	var out []ModuleProblem
	var minPages int64
	if _, err := fmt.Sscanf(rep.Memory, "min %d pages", &minPages); err == nil && minPages*wasmPage > q.GuestMemoryBytes {
		out = append(out, ModuleProblem{"quota", fmt.Sprintf("the module needs at least %d bytes of memory (%d pages); the tenant's guest_memory_bytes quota is %d", minPages*wasmPage, minPages, q.GuestMemoryBytes)})
	}
	if m := rep.Manifest; m != nil {
		if len(m.Endpoints) > 0 && (len(q.AllowedLookupHosts) == 0 || q.LookupRequestsPerSec == 0) {
			out = append(out, ModuleProblem{"quota", fmt.Sprintf("the module declares lookup endpoints (%s) but the tenant may not make lookups (allowed_lookup_hosts is empty or lookup_requests_per_second is 0)", strings.Join(m.Endpoints, ", "))})
		}
		if len(m.States) > 0 && q.StateBytes == 0 {
			out = append(out, ModuleProblem{"quota", fmt.Sprintf("the module declares keyed state (%s) but the tenant's state_bytes quota is 0", strings.Join(m.States, ", "))})
		}
	}
	return out
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func (s *Server) listModules(c echo.Context) error {
	cat := s.ctl.Snapshot()
	p := principalOf(c)
	var mods []*control.Module
	if p.admin && c.QueryParam("tenant") == "" {
		for _, m := range cat.Modules {
			mods = append(mods, m)
		}
	} else {
		tenant, err := s.tenantFor(c)
		if err != nil {
			return err
		}
		mods = cat.TenantModules(tenant)
	}
	name := c.QueryParam("name")
	items := make([]ModuleView, 0, len(mods))
	for _, m := range mods {
		if name == "" || m.Name == name {
			items = append(items, viewModule(cat, m))
		}
	}
	key := func(v ModuleView) string {
		return v.Tenant + "/" + v.Name + "@" + fmt.Sprintf("%020s", v.Version) + "/" + v.ID
	}
	slices.SortFunc(items, func(a, b ModuleView) int { return strings.Compare(key(a), key(b)) })
	return page(c, items, key)
}

func (s *Server) getModule(c echo.Context) error {
	tenant, err := s.tenantFor(c)
	if err != nil {
		return err
	}
	cat := s.ctl.Snapshot()
	m, err := resolveModule(cat, tenant, c.Param("id"), "id")
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewModule(cat, m))
}

func (s *Server) deleteModule(c echo.Context) error {
	tenant, err := s.tenantFor(c)
	if err != nil {
		return err
	}
	var id string
	err = s.ctl.Update(c.Request().Context(), func(cat *control.Catalog) error {
		m, err := resolveModule(cat, tenant, c.Param("id"), "id")
		if err != nil {
			return err
		}
		if users := usersOf(cat, m); len(users) > 0 {
			return problem(http.StatusConflict, CodeInUse, "id", "module %s@%s is used by pipeline%s %s; delete or change %s first", m.Name, m.Version, plural(len(users)), strings.Join(users, ", "), map[bool]string{true: "it", false: "them"}[len(users) == 1])
		}
		id = m.ID
		delete(cat.Modules, control.ModuleKey(tenant, m.ID))
		return nil
	})
	if err != nil {
		return err
	}
	if err := s.ctl.DeleteBlobIfUnused(c.Request().Context(), id); err != nil {
		s.log.WarnContext(c.Request().Context(), "module blob not removed", "id", id, "err", err)
	}
	s.log.InfoContext(c.Request().Context(), "module deleted", "tenant", tenant, "id", id)
	return c.NoContent(http.StatusNoContent)
}
