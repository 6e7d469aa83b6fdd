package server

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"

	"github.com/clink-wasm/clink-wasm/host/control"
)

var secretNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// SecretsFromFile reads the server's per-tenant secrets (serve --kafka-secrets FILE): a JSON
// object of tenant names to objects of secret names to values,
//
//	{"acme": {"kafka-user": "bob", "kafka-password": "..."}}
//
// and returns the lookup for Config.KafkaSecrets. A tenant's spec names its own secrets only:
// the lookup is keyed by the tenant the spec belongs to, never by anything the spec says.
func SecretsFromFile(path string) (func(tenant, name string) (string, bool), error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("secrets: %w", err)
	}
	var m map[string]map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("secrets %s: want {\"TENANT\": {\"NAME\": \"VALUE\"}}: %w", path, err)
	}
	for t, names := range m {
		if !control.ValidTenantName(t) {
			return nil, fmt.Errorf("secrets %s: %q is not a tenant name", path, t)
		}
		for n := range names {
			if !secretNameRE.MatchString(n) {
				return nil, fmt.Errorf("secrets %s: tenant %s: %q is not a secret name (1-64 of A-Z a-z 0-9 _ . -)", path, t, n)
			}
		}
	}
	return func(tenant, name string) (string, bool) {
		v, ok := m[tenant][name]
		return v, ok
	}, nil
}
