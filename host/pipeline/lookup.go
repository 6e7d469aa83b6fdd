package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
)

// openLookups opens the pipeline's endpoints and returns the LookupFunc serving the module's
// `lookup` import: the guest's endpoint index is its position in the manifest's endpoints.
func openLookups(reg *lookup.Registry, tenant string, cfgs []lookup.EndpointConfig, declared []string) (scheduler.LookupFunc, func() map[string]lookup.Metrics, error) {
	byName := make(map[string]*lookup.Endpoint, len(cfgs))
	closeAll := func() map[string]lookup.Metrics {
		ms := make(map[string]lookup.Metrics, len(byName))
		for name, ep := range byName {
			ep.Close()
			ms[name] = ep.Metrics()
		}
		return ms
	}
	for _, c := range cfgs {
		if _, dup := byName[c.Name]; dup {
			closeAll()
			return nil, nil, fmt.Errorf("endpoint %q is defined twice", c.Name)
		}
		ep, err := reg.Open(tenant, c)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("endpoint %q: %w", c.Name, err)
		}
		byName[c.Name] = ep
	}
	eps := make([]*lookup.Endpoint, len(declared))
	for i, n := range declared {
		eps[i] = byName[n] // presence was checked when the module loaded
	}
	fn := func(ctx context.Context, idx uint32, raw []byte, done func(int, []byte, error)) {
		if int(idx) >= len(eps) || eps[idx] == nil {
			done(0, nil, abi.InvalidArgument)
			return
		}
		// DoRaw parses the guest's bytes itself, so a malformed request is counted and logged
		// by the endpoint like any other refusal (naming its rule).
		eps[idx].DoRaw(ctx, raw, func(r lookup.Response) {
			if r.Err != nil {
				// The guest sees the code; the error keeps the endpoint's reason (for a refusal,
				// the rule) for whoever reports the call.
				done(0, nil, fmt.Errorf("%w: %w", abi.Code(lookup.Kind(r.Err).ABICode()), r.Err))
				return
			}
			done(r.Status, r.Body, nil)
		})
	}
	return fn, closeAll, nil
}

// EndpointNames lists the names of cfgs.
func EndpointNames(cfgs []lookup.EndpointConfig) []string {
	names := make([]string, len(cfgs))
	for i, c := range cfgs {
		names[i] = c.Name
	}
	return names
}

// ParseEndpointFlag reads a --endpoint NAME=URL shorthand. An endpoint whose URL names a
// loopback host is allowed to reach loopback: the user asked for it explicitly.
func ParseEndpointFlag(s string) (lookup.EndpointConfig, error) {
	name, raw, ok := strings.Cut(s, "=")
	if !ok || name == "" || raw == "" {
		return lookup.EndpointConfig{}, errors.New("want NAME=URL")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return lookup.EndpointConfig{}, errors.New("not an http(s) URL")
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return lookup.EndpointConfig{}, fmt.Errorf("%q is not an http(s) URL", u.Redacted())
	}
	c := lookup.EndpointConfig{Name: name, BaseURL: raw}
	host := u.Hostname()
	if host == "localhost" {
		c.Egress.AllowLoopback = true
	} else if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		c.Egress.AllowLoopback = true
	}
	return c, nil
}

// LoadEndpoints reads endpoint configurations from a JSON file: an array of endpoint objects,
// or an object with an "endpoints" array.
func LoadEndpoints(path string) ([]lookup.EndpointConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var list []lookup.EndpointConfig
	if err := json.Unmarshal(b, &list); err != nil {
		var wrapped struct {
			Endpoints []lookup.EndpointConfig `json:"endpoints"`
		}
		if err2 := json.Unmarshal(b, &wrapped); err2 != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		list = wrapped.Endpoints
	}
	return list, nil
}
