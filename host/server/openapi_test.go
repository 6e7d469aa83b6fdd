package server

import (
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"testing"
)

// TestOpenAPIMatchesRoutes checks that /openapi.json describes exactly the routes echo serves.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	e := newEnv(t)
	r := e.do("GET", "/openapi.json", "", "", nil)
	if r.code != 200 {
		t.Fatalf("openapi.json: %d", r.code)
	}
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
		Comp    struct {
			Schemas map[string]json.RawMessage `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(r.body, &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi %q", doc.OpenAPI)
	}
	var documented, served []string
	for p, ops := range doc.Paths {
		for m, op := range ops {
			documented = append(documented, strings.ToUpper(m)+" "+p)
			var o struct {
				Summary   string                     `json:"summary"`
				Responses map[string]json.RawMessage `json:"responses"`
				Params    []struct {
					Name, In string
				} `json:"parameters"`
			}
			if err := json.Unmarshal(op, &o); err != nil {
				t.Fatal(err)
			}
			if o.Summary == "" || len(o.Responses) < 2 {
				t.Errorf("%s %s: summary %q, %d responses", m, p, o.Summary, len(o.Responses))
			}
			// Every {param} of the path is declared.
			for _, seg := range strings.Split(p, "/") {
				if strings.HasPrefix(seg, "{") {
					name := strings.Trim(seg, "{}")
					if !slices.ContainsFunc(o.Params, func(x struct{ Name, In string }) bool { return x.Name == name && x.In == "path" }) {
						t.Errorf("%s %s: path parameter %s undeclared", m, p, name)
					}
				}
			}
		}
	}
	for _, rt := range e.srv.echo.Routes() {
		served = append(served, rt.Method+" "+openAPIPath(rt.Path))
	}
	sort.Strings(documented)
	sort.Strings(served)
	if !slices.Equal(documented, served) {
		t.Fatalf("routes and document differ\nserved:     %v\ndocumented: %v", served, documented)
	}
	// Every $ref resolves.
	for _, ref := range refsIn(r.body) {
		name := strings.TrimPrefix(ref, "#/components/schemas/")
		if name == ref {
			continue
		}
		if _, ok := doc.Comp.Schemas[name]; !ok {
			t.Errorf("dangling $ref %s", ref)
		}
	}
}

func refsIn(b []byte) []string {
	var out []string
	s := string(b)
	for {
		i := strings.Index(s, `"$ref": "`)
		if i < 0 {
			return out
		}
		s = s[i+len(`"$ref": "`):]
		j := strings.IndexByte(s, '"')
		out = append(out, s[:j])
		s = s[j:]
	}
}
