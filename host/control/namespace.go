package control

import (
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
)

var (
	tenantNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	pipelineIDRE = regexp.MustCompile(`^pl-[0-9a-f]{16}$`)
)

// ValidTenantName reports whether n can name a tenant: a DNS label (as a Kubernetes namespace),
// which can appear in a URL path, an object name and a metric label without escaping.
func ValidTenantName(n string) bool { return tenantNameRE.MatchString(n) }

// ValidPipelineID reports whether id has the form of a pipeline id (pl- and 16 hex digits).
func ValidPipelineID(id string) bool { return pipelineIDRE.MatchString(id) }

// StateURL is the state pool URL (host/state) of pipeline id of tenant under the server's data
// URL: <data>/state/<tenant>/<id>, with the data URL's query (s3 endpoint and the like) kept.
// Every pipeline's keyed state is thereby namespaced per tenant and pipeline, and neither name
// can step out of its place: both are checked here, not only by the API.
func StateURL(dataURL, tenant, id string) (string, error) {
	if !ValidTenantName(tenant) {
		return "", fmt.Errorf("control: %q is not a tenant name", tenant)
	}
	if !ValidPipelineID(id) {
		return "", fmt.Errorf("control: %q is not a pipeline id", id)
	}
	sub := "state/" + tenant + "/" + id
	if !strings.Contains(dataURL, "://") {
		abs, err := filepath.Abs(dataURL)
		if err != nil {
			return "", err
		}
		return "file://" + filepath.ToSlash(filepath.Join(abs, filepath.FromSlash(sub))), nil
	}
	u, err := url.Parse(dataURL)
	if err != nil {
		return "", fmt.Errorf("control: bad data URL %q: %w", dataURL, err)
	}
	switch u.Scheme {
	case "file", "s3":
	default:
		return "", fmt.Errorf("control: unsupported data URL scheme %q", u.Scheme)
	}
	u.Path = strings.TrimRight(u.Path, "/") + "/" + sub
	if u.Scheme == "s3" {
		u.Path = "/" + strings.TrimLeft(u.Path, "/")
	}
	return u.String(), nil
}
